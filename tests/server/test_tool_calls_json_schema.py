"""Bar `tool-calls-json-schema`: `g4bench serve --model small` (synthetic weights) as its own
process, the official `openai` client, temperature 1, one seed per request.

Held-out schemas and tools (not the bounded ones agent_schemas.py was tuned to): free `number`
and `integer` fields, strings without `maxLength`, arrays without `maxItems`, nesting. Sampling
from synthetic weights extends such values until `max_tokens`, so before the budget-aware grammar
replies ended mid-JSON (8/12, 5/6 at max_tokens 200). For each max_tokens in (200, 80, 40) every
response_format reply must parse and validate, every tool_choice reply must carry a parsed
`tool_calls` entry with valid arguments, or the request gets a 400 naming max_tokens before
generating (only when even the shortest valid output does not fit). The slow test runs
12 schemas x 4 seeds + 6 tools x 4 seeds = 72 requests per max_tokens, 216 seeds in all, and prints
the counts; `python -m tests.server.test_tool_calls_json_schema [seeds]` does the same by hand.
Each tool request declares its one tool (270-400 prompt tokens in the byte-level synthetic
tokenizer; all six at once would take ~1,500) and alternates "required" and the named choice.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest

openai = pytest.importorskip("openai")

NUM, INT, STR = {"type": "number"}, {"type": "integer"}, {"type": "string"}


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required}


HELD_SCHEMAS = [
    obj({"price": NUM}),
    obj({"count": INT}),
    obj({"lat": NUM, "lon": NUM}),
    obj({"name": STR, "age": INT}),
    obj({"xs": {"type": "array", "items": NUM}}),
    obj({"user": obj({"id": INT, "score": NUM})}),
    obj({"tags": {"type": "array", "items": STR}, "n": INT}),
    obj({"a": obj({"b": obj({"c": NUM})})}),
    obj({"rows": {"type": "array", "items": obj({"k": STR, "v": NUM})}}),
    obj({"t": NUM, "unit": {"enum": ["c", "f"]}, "note": STR}, ["t", "unit"]),
    obj({"ok": {"type": "boolean"}, "why": STR}),
    obj({"m": {"type": "array", "items": {"type": "array", "items": INT}}, "total": NUM}),
]
HELD_TOOLS = [
    ("get_weather", obj({"city": STR, "days": INT}, ["city"])),
    ("add", obj({"xs": {"type": "array", "items": NUM}})),
    ("set_price", obj({"sku": STR, "price": NUM})),
    ("move", obj({"x": NUM, "y": NUM, "z": NUM})),
    ("tag", obj({"id": INT, "labels": {"type": "array", "items": STR}})),
    ("book", obj({"when": obj({"day": INT, "hour": INT}), "who": STR})),
]
TOOLS = [
    {"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": p}}
    for n, p in HELD_TOOLS
]
MAX_TOKENS = (200, 80, 40)


def start_serve(model: str = "small") -> tuple[subprocess.Popen, str]:
    """`g4bench serve` in its own process, its log in a temporary file (a pipe nobody drains would
    block it); returns once it has printed `ready`."""
    cmd = [sys.executable, "-m", "g4bench.cli", "serve", "--model", model, "--port", "0", "--max-slots", "8",
           "--max-len", "768", "--queue-timeout", "1800"]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, text=True, env={**os.environ, "COLUMNS": "200"})
    end = time.monotonic() + 1800
    while time.monotonic() < end and proc.poll() is None:
        text = Path(log.name).read_text()
        m = re.search(r"on (http://[\d.]+:\d+)/v1", text)
        if m and "ready" in text:
            return proc, m.group(1)
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"serve --model {model} did not become ready: {Path(log.name).read_text()[-2000:]}")


def one(client, kind: str, i: int, seed: int, max_tokens: int) -> str:
    """'ok', 'refused' (400 naming max_tokens) or a failure description."""
    msgs = [{"role": "user", "content": f"request {i} seed {seed}: answer"}]
    common = {"model": "small", "messages": msgs, "temperature": 1.0, "seed": seed, "max_tokens": max_tokens}
    try:
        if kind == "schema":
            fmt = {
                "type": "json_schema",
                "json_schema": {"name": f"s{i}", "schema": HELD_SCHEMAS[i], "strict": True},
            }
            r = client.chat.completions.create(response_format=fmt, **common)
            value = json.loads(r.choices[0].message.content)
            jsonschema.validate(value, HELD_SCHEMAS[i])
            return "ok"
        name, params = HELD_TOOLS[i]
        choice = "required" if seed % 2 else {"type": "function", "function": {"name": name}}
        r = client.chat.completions.create(tools=[TOOLS[i]], tool_choice=choice, **common)
        calls = r.choices[0].message.tool_calls
        if not calls:
            return f"no tool_calls: {r.choices[0].message.content!r}"
        for call in calls:
            schema = dict(HELD_TOOLS)[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), schema)
        return "ok"
    except openai.BadRequestError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return "refused" if body.get("param") == "max_tokens" else f"400: {exc}"
    except Exception as exc:  # noqa: BLE001 - a failed case is counted and shown, not raised
        return f"{type(exc).__name__}: {exc}"


def run_bar(url: str, seeds: int) -> dict:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=1800, max_retries=0)
    out = {}
    with ThreadPoolExecutor(8) as pool:
        for max_tokens in MAX_TOKENS:
            jobs = [("schema", i, s) for i in range(len(HELD_SCHEMAS)) for s in range(seeds)]
            jobs += [("tool", i, s) for i in range(len(HELD_TOOLS)) for s in range(seeds)]
            results = list(pool.map(lambda j: (j, one(client, *j, max_tokens)), jobs))  # noqa: B023
            fig = {"schema_ok": 0, "schema_refused": 0, "tool_ok": 0, "tool_refused": 0, "failures": []}
            for (kind, i, s), res in results:
                if res in ("ok", "refused"):
                    fig[f"{kind}_{res}"] += 1
                else:
                    fig["failures"].append(f"{kind} {i} seed {s}: {res}")
            per_item = {}
            for (kind, i, _), res in results:
                per_item.setdefault((kind, i), set()).add(res)
            fig["schemas_all_valid"] = sum(
                per_item[("schema", i)] <= {"ok", "refused"} for i in range(len(HELD_SCHEMAS))
            )
            fig["tools_all_valid"] = sum(
                per_item[("tool", i)] <= {"ok", "refused"} for i in range(len(HELD_TOOLS))
            )
            fig["requests"] = len(jobs)
            out[max_tokens] = fig
            print(f"max_tokens {max_tokens}: {len(jobs)} requests; json_schema valid {fig['schemas_all_valid']}/12 "
                  f"({fig['schema_ok']} ok, {fig['schema_refused']} refused 400), tool_choice valid "
                  f"{fig['tools_all_valid']}/6 ({fig['tool_ok']} ok, {fig['tool_refused']} refused 400), "
                  f"{len(fig['failures'])} failures {fig['failures'][:3]}", flush=True)  # fmt: skip
    return out


@pytest.mark.slow
def test_tool_calls_json_schema_bar():
    proc, url = start_serve()
    try:
        figs = run_bar(url, seeds=4)
    finally:
        proc.terminate()
        proc.wait(60)
    assert sum(fig["requests"] for fig in figs.values()) >= 200
    for max_tokens, fig in figs.items():
        assert fig["failures"] == [], (max_tokens, fig["failures"][:5])
        assert fig["schemas_all_valid"] == 12 and fig["tools_all_valid"] == 6
        if max_tokens == 200:  # every held schema and tool fits 200 tokens: nothing may be refused
            assert fig["schema_refused"] == fig["tool_refused"] == 0


if __name__ == "__main__":
    proc, url = start_serve()
    try:
        run_bar(url, int(sys.argv[1]) if len(sys.argv) > 1 else 4)
    finally:
        proc.terminate()
