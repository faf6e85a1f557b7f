"""From raw request bytes to a validated, tokenized request: every bound is checked before the work
it protects, and the work itself stays off the event loop.

    read_body (event loop)     Content-Length above `max_body_bytes` → 413 before a byte is read;
                               a chunked body is counted as it arrives and cut at the limit; the
                               whole body must arrive within `body_timeout_s` → 408.
    Preparer.prepare (worker   1. JSON: not UTF-8, malformed, NaN/Infinity, numbers past 64 bits,
    thread)                       nesting past Python's recursion limit → 400.
                               2. fields this server does not implement (protocol.UNSUPPORTED) → 400
                                  naming the field; a string holding a lone UTF-16 surrogate → 400
                                  naming the field (it cannot be encoded, and used to become a 500).
                               3. prompt size before tokenizing: more characters than `max_len` ×
                                  the tokenizer's `max_token_chars`, or an id list of `max_len` or
                                  more → 400 context_length_exceeded.
                               4. pydantic (types, ranges) → 400 naming the field; model name → 404.
                               5. chat template / tokenizer, id range scan, context checks → 400.
                               6. the agent protocol: `tools` and tool messages rendered by the
                                  template; `response_format` / `tool_choice` compiled into a
                                  grammar and a fresh matcher (GenerationParams.constraint; an
                                  unenforceable schema → 400), bounded to max_tokens by the budget
                                  keeper (grammar_budget.py; a max_tokens below the shortest valid
                                  output → 400 naming max_tokens); `logprobs` → GenerationParams.logprobs.

Work in steps 1-5 is bounded by the body limit and runs in a small thread pool, so a large or
malicious body costs a concurrent stream at most the GIL hand-offs of that pool, never a stall of
the event loop for the length of the body.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, replace
from typing import Any, cast

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request

from g4bench.engine.grammar import GrammarError, GrammarMatcher, TokenConstraint, compile_grammar
from g4bench.engine.grammar_budget import BudgetedMatcher, budgeted, request_growth
from g4bench.engine.sampling import SamplingParams
from g4bench.engine.scheduler import GenerationParams
from g4bench.engine.thinking import ThinkingCap
from g4bench.server import protocol as p
from g4bench.server.agent_vocab import AgentVocab, AgentVocabError
from g4bench.server.chat import ChatFormatter, TemplateError
from g4bench.server.errors import APIError, from_pydantic
from g4bench.server.tokenizer import Tokenizer

MAX_INT_DIGITS = 20  # JSON integers longer than this cannot fit any field (int64 at most)


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The request body, or APIError 413 (too large), 408 (too slow) or 400 (client went away)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(
            413, f"the request body exceeds the limit of {max_bytes} bytes", code="request_too_large"
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise APIError(
                        413,
                        f"the request body exceeds the limit of {max_bytes} bytes",
                        code="request_too_large",
                    )
                chunks.append(chunk)
    except TimeoutError as exc:
        raise APIError(
            408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout"
        ) from exc
    except ClientDisconnect as exc:
        raise APIError(
            400, "the client disconnected while sending the body", code="client_disconnected"
        ) from exc
    return b"".join(chunks)


@dataclass
class Prepared:
    """A request ready for the scheduler."""

    body: p.SamplingFields
    prompt: list[int]
    params: GenerationParams
    stops: list[str]
    uses_tools: bool = False  # tools declared or tool messages sent: detokenize with markers kept
    budget: BudgetedMatcher | None = None  # the grammar's budget keeper: `.forced` -> finish "length"


class Preparer:
    """Validation and tokenization for one server (thread-safe: holds no per-request state)."""

    def __init__(
        self, tokenizer: Tokenizer, model_name: str, max_len: int, vocab_size: int, engine_eos: frozenset[int]
    ) -> None:
        self.tokenizer, self.model_name = tokenizer, model_name
        self.max_len, self.vocab_size = max_len, vocab_size
        self.formatter = ChatFormatter(tokenizer)
        self.stop_ids = self.formatter.stop_token_ids | engine_eos
        self.max_prompt_chars = max_len * max(1, tokenizer.max_token_chars)
        self.vocab = AgentVocab(tokenizer, vocab_size, self.stop_ids)

    def prepare(self, endpoint: str, raw: bytes) -> Prepared:
        data = parse_json(raw)
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object")
        name = p.unsupported_field(data)
        if name is not None:
            raise APIError(
                400,
                f"{name} is not supported by this server (accepted only as null or a value that asks "
                "for nothing); remove it",
                param=name,
                code="unsupported_parameter",
            )
        bad = _surrogate_field(data)
        if bad is not None:
            raise APIError(
                400,
                f"{bad} contains a lone UTF-16 surrogate (not valid Unicode)",
                param=None if bad == "body" else bad,
            )
        param = "messages" if endpoint == "chat" else "prompt"
        self._check_size(data, param)
        cls = p.ChatCompletionRequest if endpoint == "chat" else p.CompletionRequest
        try:
            body = cls.model_validate(data)
        except ValidationError as exc:
            raise from_pydantic(exc) from exc
        if body.model != self.model_name:
            raise APIError(
                404,
                f"the requested model does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        uses_tools = False
        if isinstance(body, p.ChatCompletionRequest):
            messages = [m.template_dict() for m in body.messages]
            tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
            uses_tools = bool(tools) or any(m.uses_tools for m in body.messages)
            try:
                prompt = self.formatter.encode(messages, tools)
            except TemplateError as exc:
                raise APIError(400, str(exc), param="messages") from exc
            stops = (body.stop or []) + self.formatter.stop_strings
        else:
            # the validator unwrapped a one-element list: text or ids remain
            ids = cast(list[int], body.prompt)
            prompt = self.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(ids)
            stops = body.stop or []
        params = self._agent(body, self.params(param, body, prompt), uses_tools)
        constraint = params.constraint
        keeper = constraint if isinstance(constraint, BudgetedMatcher) else getattr(constraint, "then", None)
        return Prepared(
            body, prompt, params, stops, uses_tools, keeper if isinstance(keeper, BudgetedMatcher) else None
        )

    def _agent(self, body: p.SamplingFields, params: GenerationParams, uses_tools: bool) -> GenerationParams:
        """The grammar matcher and logprob count the request asks for, added to its parameters.
        Requests that will detokenize through `AgentVocab.piece` build the vocabulary here, in
        the worker thread, never on the event loop."""
        if isinstance(body, p.ChatCompletionRequest):
            k = (body.top_logprobs or 0) if body.logprobs else None
            request = body.grammar_request()
        else:
            assert isinstance(body, p.CompletionRequest)
            k = body.logprobs
            fmt = body.response_format
            request = {
                "response_format": None if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True)
            }
        if (uses_tools or k is not None) and not self.vocab.synthetic:
            try:
                self.vocab.grammar()
            except AgentVocabError as exc:
                raise APIError(400, str(exc), param="tools" if uses_tools else "logprobs") from exc
        constraint: TokenConstraint | None = None
        if request.get("response_format") or request.get("tool_choice") not in (None, "auto", "none"):
            param = (
                "tool_choice"
                if request.get("tool_choice") not in (None, "auto", "none")
                else "response_format"
            )
            try:
                vocab = self.vocab.grammar()
                grammar = compile_grammar(**request, vocab=vocab)
                matcher = None if grammar is None else vocab.matcher(grammar)
            except (GrammarError, AgentVocabError) as exc:
                raise APIError(400, str(exc), param=param) from exc
            if matcher is not None and (params.ignore_eos or params.min_tokens):
                # the grammar ends the reply with EOS; banning or ignoring it has no valid continuation
                raise APIError(400, f"{param} cannot be combined with ignore_eos or min_tokens", param=param)
            if matcher is not None:
                constraint = self._budgeted(matcher, request, params.max_tokens, body)
        budget = body.thinking_budget if isinstance(body, p.ChatCompletionRequest) else None
        if budget is not None:
            # the cap watches for a channel the model opens and closes it past the budget; a grammar,
            # if any, rules from the first token (it excludes `<|channel>`), as in ThinkingCap's docstring
            try:
                vocab = self.vocab.grammar()
            except AgentVocabError as exc:
                raise APIError(400, str(exc), param="thinking_budget") from exc
            return replace(params, constraint=ThinkingCap(vocab, budget, then=constraint), logprobs=k)
        return replace(params, constraint=constraint, logprobs=k)

    @staticmethod
    def _budgeted(
        constraint: GrammarMatcher, request: dict, max_tokens: int, body: p.SamplingFields
    ) -> BudgetedMatcher:
        """The matcher bounded to the tokens the reply may write (400 naming max_tokens when even the
        shortest valid output does not fit). A thinking budget's tokens come out of max_tokens first
        (the cap closes the channel after `thinking_budget` tokens and its two markers)."""
        thinking = body.thinking_budget if isinstance(body, p.ChatCompletionRequest) else None
        budget = max_tokens - (thinking + 2 if thinking is not None else 0)
        try:
            return budgeted(
                constraint,
                budget,
                request_growth(
                    request.get("response_format"), request.get("tools"), request.get("tool_choice")
                ),
            )
        except GrammarError as exc:
            raise APIError(400, str(exc), param="max_tokens") from exc

    def _check_size(self, data: dict, param: str) -> None:
        """Reject prompts that cannot fit before any tokenizing (cheap: lengths only)."""
        value = data.get(param)
        chars, ids = 0, 0
        if param == "messages" and isinstance(value, list):
            for m in value:
                content = m.get("content") if isinstance(m, dict) else None
                parts = content if isinstance(content, list) else [content]
                for part in parts:
                    text = part.get("text") if isinstance(part, dict) else part
                    chars += len(text) if isinstance(text, str) else 0
        elif isinstance(value, str):
            chars = len(value)
        elif isinstance(value, list) and value:
            inner = value[0] if len(value) == 1 and isinstance(value[0], str | list) else value
            chars, ids = (len(inner), 0) if isinstance(inner, str) else (0, len(inner))
        if chars > self.max_prompt_chars or ids >= self.max_len:
            what = f"{chars} characters" if chars else f"{ids} token ids"
            raise APIError(
                400,
                f"the prompt ({what}) cannot fit the context length of {self.max_len} tokens",
                param=param,
                code="context_length_exceeded",
            )

    def params(self, param: str, body: p.SamplingFields, prompt: list[int]) -> GenerationParams:
        """Check lengths and ids against the engine and build the scheduler's parameters."""
        max_len = self.max_len
        if not prompt:
            raise APIError(400, "the prompt is empty", param=param)
        if len(prompt) >= max_len:
            raise APIError(
                400,
                f"the prompt has {len(prompt)} tokens; the context length is {max_len}",
                param=param,
                code="context_length_exceeded",
            )
        if any(not 0 <= t < self.vocab_size for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {self.vocab_size})", param=param)
        limit = body.output_limit if body.output_limit is not None else max_len - len(prompt)
        if len(prompt) + limit > max_len:
            raise APIError(
                400,
                f"prompt ({len(prompt)} tokens) + max_tokens ({limit}) exceeds the context length {max_len}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if body.min_tokens > limit:
            raise APIError(
                400, f"min_tokens ({body.min_tokens}) exceeds max_tokens ({limit})", param="min_tokens"
            )
        top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
        sampling = SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_k=0 if top_k >= self.vocab_size else top_k,  # k >= vocabulary: no limit, exactly
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=random.getrandbits(31) if body.seed is None else body.seed % 2**32,
        )
        return GenerationParams(limit, sampling, body.min_tokens, body.ignore_eos, self.stop_ids)


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError("an integer in the body has more digits than any field accepts")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("a number in the body is out of the float64 range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, "the request body is not valid UTF-8") from exc
    try:
        return json.loads(
            text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
        )
    except RecursionError as exc:
        raise APIError(400, "malformed JSON body: nested too deeply") from exc
    except json.JSONDecodeError as exc:
        raise APIError(
            400, f"malformed JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except ValueError as exc:  # from the parse hooks above: their messages are ours
        raise APIError(400, f"malformed JSON body: {exc}") from exc


def _surrogate_field(data: dict) -> str | None:
    """The first top-level field whose value (or the body's first key) holds a lone surrogate: the
    field's name when it is one of ours, "body" otherwise (client-chosen names are not echoed)."""
    known = p.ChatCompletionRequest.model_fields.keys() | p.CompletionRequest.model_fields.keys()
    for key, value in data.items():
        stack: list[Any] = [key, value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if not item.isascii() and not _encodable(item):
                    return key if key in known else "body"
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
