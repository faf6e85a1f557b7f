"""The agent protocol end to end over HTTP: the real engine on the tiny model (synthetic weights),
paged KV (the server default), chunked prefill (chunk 64 < the tool prompts), a live uvicorn server.

- `response_format` json_schema (strict) over the 21 schemas of agent_schemas.py at temperature 1
  (and greedy): every output parses and validates (jsonschema), streaming and not. The fast test
  sends each schema twice; the slow one 210 requests (`-m slow`).
- `tool_choice` required / named, read by the official `openai` client: every response carries a
  `tool_calls` entry whose arguments validate against the tool's parameters, streaming and not
  (the slow test: 120 requests).
- Tool history (assistant `tool_calls`, `tool` messages) is rendered into the prompt and a repeated
  conversation reuses its prefix under a grammar.
- logprobs: shapes, sorted top_logprobs whose first entry is the greedy token, streaming = whole.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

engine_mod = pytest.importorskip("g4bench.engine.engine")
openai = pytest.importorskip("openai")

from g4bench.engine.scheduler import Scheduler  # noqa: E402
from g4bench.server.app import create_app  # noqa: E402
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer  # noqa: E402
from tests.server.agent_schemas import SCHEMAS  # noqa: E402
from tests.server.conftest import DEADLINE_S, start_server  # noqa: E402

MODEL = "tiny"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add numbers.", "parameters": {
        "type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                           "maximum": 99}, "maxItems": 3}},
        "required": ["xs"], "additionalProperties": False}}},
]  # fmt: skip
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def server():
    from g4bench.model.config import load_config
    from g4bench.model.params import WeightFormat, init_params

    cfg = load_config("tiny-a")
    ecfg = engine_mod.EngineConfig(max_slots=4, max_len=1024, chunk_size=64, min_kv_bucket=1024)
    engine = engine_mod.Engine(cfg, init_params(cfg, WeightFormat(layers="f32"), seed=0), ecfg)
    sched = Scheduler(engine).start()
    assert sched.wait_ready(120)
    app = create_app(sched, SyntheticTokenizer(cfg.vocab_size), MODEL)
    url, stop = start_server(app)
    yield url, sched
    stop()
    sched.stop()


def chat_body(**kw) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Reply in JSON."}], "max_tokens": 200}
    return {**body, **kw}


def post_chat(url: str, body: dict) -> tuple[dict, str]:
    """(the assembled message, finish_reason), from a whole response or a folded stream."""
    with httpx.Client(base_url=url, timeout=DEADLINE_S * 4) as http:
        if not body.get("stream"):
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            return choice["message"], choice["finish_reason"]
        msg: dict = {"content": "", "tool_calls": {}}
        reason = None
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                delta = choice["delta"]
                msg["content"] += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    msg["tool_calls"][call["index"]] = call
                reason = choice["finish_reason"] or reason
        msg["tool_calls"] = [msg["tool_calls"][i] for i in sorted(msg["tool_calls"])]
        return msg, reason


def schema_case(url: str, i: int, schema: dict, stream: bool, temperature: float, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    body = chat_body(response_format=fmt, stream=stream, temperature=temperature, seed=seed,
                     messages=[{"role": "user", "content": f"Fill schema {i} (seed {seed})."}])  # fmt: skip
    msg, reason = post_chat(url, body)
    assert reason == "stop", (schema, msg)
    jsonschema.validate(json.loads(msg["content"]), schema)


def run_schemas(url: str, repeats: int) -> int:
    cases = [(i, s, (i + r) % 2 == 1, 0.0 if r == 0 and i % 3 == 0 else 1.0, 100 * i + r)
             for i, s in enumerate(SCHEMAS) for r in range(repeats)]  # fmt: skip
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda c: schema_case(url, *c), cases))
    return len(cases)


def test_json_schemas_validate(server):
    url, _ = server
    assert len(SCHEMAS) >= 20
    assert run_schemas(url, 2) == 2 * len(SCHEMAS)


@pytest.mark.slow
def test_json_schemas_validate_210(server):
    url, _ = server
    assert run_schemas(url, 10) >= 200


def test_json_object(server):
    url, _ = server
    for stream in (False, True):
        msg, _ = post_chat(url, chat_body(response_format={"type": "json_object"}, stream=stream, seed=3))
        assert isinstance(json.loads(msg["content"]), dict)


def test_thinking_budget_wraps_the_grammar_and_is_validated(server):
    """`thinking_budget` puts a ThinkingCap in front of the request's grammar (its closing rules are
    tested in tests/engine/test_thinking.py): the reply still parses under the schema, temperature 1;
    a budget below 1 is a 400 naming the field."""
    url, _ = server
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMAS[0], "strict": True}}
    for stream in (False, True):
        msg, _ = post_chat(url, chat_body(response_format=fmt, thinking_budget=8, temperature=1.0, seed=11,
                                          stream=stream))  # fmt: skip
        jsonschema.validate(json.loads(msg["content"]), SCHEMAS[0])
    r = httpx.post(f"{url}/v1/chat/completions", json=chat_body(thinking_budget=0), timeout=DEADLINE_S)
    assert r.status_code == 400 and "thinking_budget" in r.text


def test_strict_schema_the_grammar_cannot_enforce_is_a_400(server):
    url, _ = server
    fmt = {
        "type": "json_schema",
        "json_schema": {"schema": {"type": "object", "oneOf": [{}, {}]}, "strict": True},
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=chat_body(response_format=fmt), timeout=DEADLINE_S)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def tool_case(client, i: int, stream: bool, named: bool) -> None:
    choice = {"type": "function", "function": {"name": "add"}} if named else "required"
    parallel = i % 3 == 0  # one or more calls: a sampled model may go on calling until max_tokens
    kw = dict(model=MODEL, tools=TOOLS, tool_choice=choice, max_tokens=200, temperature=1.0, seed=i,
              parallel_tool_calls=parallel, messages=[{"role": "user", "content": f"Task {i}: use a tool."}])  # fmt: skip
    if stream:
        calls: dict[int, dict] = {}
        reason = None
        for chunk in client.chat.completions.create(stream=True, **kw):
            c = chunk.choices[0] if chunk.choices else None
            for d in (c.delta.tool_calls or []) if c else []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            reason = (c.finish_reason if c else None) or reason
        found = [calls[k] for k in sorted(calls)]
    else:
        resp = client.chat.completions.create(**kw)
        reason = resp.choices[0].finish_reason
        found = [{"name": t.function.name, "arguments": t.function.arguments} for t in resp.choices[0].message.tool_calls or []]  # fmt: skip
    assert found and (reason == "tool_calls" or (parallel and reason == "length")), (i, found, reason)
    assert parallel or len(found) == 1
    for call in found:
        assert not named or call["name"] == "add"
        jsonschema.validate(json.loads(call["arguments"]), PARAMS[call["name"]])


def run_tools(url: str, n: int) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=DEADLINE_S * 4)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: tool_case(client, i, i % 2 == 1, i % 5 == 4), range(n)))


def test_tool_choice_openai_client(server):
    run_tools(server[0], 10)


@pytest.mark.slow
def test_tool_choice_required_120(server):
    run_tools(server[0], 120)


def test_tool_history_and_prefix_reuse(server):
    url, _ = server
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'},
    ]  # fmt: skip
    body = chat_body(messages=messages, tools=TOOLS, tool_choice="required", return_token_ids=True, seed=1)
    with httpx.Client(base_url=url, timeout=DEADLINE_S * 4) as http:
        first = http.post("/v1/chat/completions", json=body).json()
        second = http.post("/v1/chat/completions", json=body).json()
    prompt = SyntheticTokenizer(512).decode(first["prompt_token_ids"])
    assert '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>' in prompt
    assert prompt.endswith("<|tool_response>response:get_weather{temp:-3}<tool_response|>")
    assert len(first["prompt_token_ids"]) > 64  # chunked prefill
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    for resp in (first, second):
        calls = resp["choices"][0]["message"]["tool_calls"]
        assert calls and all(c["function"]["name"] in PARAMS for c in calls)


def test_chat_logprobs(server):
    url, _ = server
    body = chat_body(max_tokens=12, temperature=0, logprobs=True, top_logprobs=3, ignore_eos=True)
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=DEADLINE_S).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"] == 12
    for e in content:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy: the most likely token
        assert e["logprob"] == pytest.approx(tops[0], abs=1e-6)
    streamed = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=DEADLINE_S
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                lp = (
                    json.loads(line[6:])["choices"][0].get("logprobs")
                    if json.loads(line[6:])["choices"]
                    else None
                )
                streamed += (lp or {}).get("content", [])
    # the same tokens; the second request reuses the cached prompt, so its logits differ in the last bits
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=1e-3)


def test_completion_logprobs(server):
    url, _ = server
    body = {
        "model": MODEL,
        "prompt": "abc",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 2,
        "ignore_eos": True,
    }
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=DEADLINE_S).json()["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["token_logprobs"]) == 6
    assert all(len(t) <= 2 and max(t.values()) == pytest.approx(v, abs=1e-6) for t, v in zip(lp["top_logprobs"], lp["token_logprobs"], strict=True))  # fmt: skip
    assert lp["text_offset"][0] == 0


UNBOUNDED = {"type": "object", "properties": {"x": {"type": "number"}, "note": {"type": "string"}},
             "required": ["x", "note"]}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_unbounded_schema_closes_within_max_tokens(server, stream):
    """Free number and string fields at temperature 1: the reply is complete JSON within max_tokens;
    a close the budget forced says finish_reason "length"."""
    url, _ = server
    fmt = {"type": "json_schema", "json_schema": {"name": "u", "schema": UNBOUNDED, "strict": True}}
    reasons = []
    for seed in range(4):
        body = chat_body(response_format=fmt, stream=stream, temperature=1.0, seed=seed, max_tokens=24)
        msg, reason = post_chat(url, body)
        assert reason in ("stop", "length") and len(msg["content"]) <= 24  # one byte per token here
        jsonschema.validate(json.loads(msg["content"]), UNBOUNDED)
        reasons.append(reason)
    assert "length" in reasons  # 24 tokens cannot hold what the tiny model writes unforced


@pytest.mark.parametrize(
    "extra",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": UNBOUNDED}}},
        {"tools": TOOLS, "tool_choice": "required"},
    ],
    ids=["json_schema", "tool_choice"],
)
def test_max_tokens_below_the_shortest_output_is_a_400(server, extra):
    url, sched = server
    r = httpx.post(f"{url}/v1/chat/completions", json=chat_body(max_tokens=8, **extra), timeout=DEADLINE_S)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens", r.text
    assert "too small" in err["message"] and "shortest" in err["message"]
