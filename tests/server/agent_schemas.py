"""JSON Schemas for the constrained-decoding tests: nested objects, arrays, enums, bounded numbers,
required and optional fields. Strings and arrays are bounded (`maxLength`, `maxItems`) and
fractional numbers carry a binary-exact `multipleOf` (0.1 would trip jsonschema's float check) so that a sampled output from synthetic weights always fits
`max_tokens` (a free `number` lets a sampler append fraction digits forever: JSON allows it, and
the grammar with it); the grammar does the rest."""

from __future__ import annotations

S = {"type": "string", "maxLength": 8}
INT = {"type": "integer", "minimum": -50, "maximum": 50}


def obj(props: dict, required: list[str] | None = None, **extra) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False, **extra}  # fmt: skip


SCHEMAS: list[dict] = [
    obj({"name": S}),
    obj({"n": INT}),
    obj({"ok": {"type": "boolean"}}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.125}}),
    obj({"age": {"type": "integer", "minimum": 0, "maximum": 150}, "name": S}, ["age"]),
    obj({"tags": {"type": "array", "items": S, "maxItems": 3}}),
    obj({"xs": {"type": "array", "items": INT, "minItems": 1, "maxItems": 4}}),
    obj({"user": obj({"id": INT, "email": S})}),
    obj({"a": obj({"b": obj({"c": {"enum": [1, 2, 3]}})})}),
    obj({"items": {"type": "array", "items": obj({"sku": S, "qty": {"type": "integer", "minimum": 1, "maximum": 9}}),
                   "maxItems": 2}}),  # fmt: skip
    obj({"level": {"enum": ["low", "mid", "high"]}, "note": S}, ["level"]),
    obj({"point": obj({"x": INT, "y": INT}), "label": S}, ["point"]),
    obj({"t": {"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.5}, "unit": {"enum": ["c", "f"]}}),
    obj({"flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}, "id": INT}),
    obj({"status": {"const": "done"}, "code": {"type": "integer", "minimum": 100, "maximum": 599}}),
    obj({"maybe": {"anyOf": [INT, {"type": "null"}]}}),
    obj({"name": S, "nick": S, "age": INT}, ["name"]),
    obj({"matrix": {"type": "array", "items": {"type": "array", "items": INT, "maxItems": 2}, "maxItems": 2}}),
    obj({"kind": {"enum": ["a", "b"]}, "meta": obj({"v": {"type": "integer", "minimum": 0, "maximum": 3}}, [])},
        ["kind"]),  # fmt: skip
    obj({"choice": {"type": "string", "enum": ["yes", "no", "maybe"]}, "weight": {"type": "number", "minimum": 0,
                                                                                 "maximum": 100, "multipleOf": 0.25}}),  # fmt: skip
]
