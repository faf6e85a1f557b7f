"""`serve`'s served-step flags reach the engine configuration through LaunchSpec."""

from __future__ import annotations

from typer.testing import CliRunner

from g4bench.cli import app
from g4bench.engine.served_step import DEFAULT_MAX_BATCHED_TOKENS
from g4bench.server.launch import LaunchSpec


def _spec_of(monkeypatch, *args: str) -> LaunchSpec:
    seen: dict[str, LaunchSpec] = {}

    def fake_run_server(spec, api_key=None):
        seen["spec"] = spec
        return 0

    monkeypatch.setattr("g4bench.server.launch.run_server", fake_run_server)
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-a", *args])
    assert result.exit_code == 0, result.output
    return seen["spec"]


def test_serve_defaults_to_the_served_step(monkeypatch):
    spec = _spec_of(monkeypatch)
    assert spec.max_batched_tokens == DEFAULT_MAX_BATCHED_TOKENS and spec.prefill_policy is None
    ecfg = spec.step().engine_config(max_slots=spec.max_slots, max_len=spec.max_len)
    assert ecfg.kv_layout == "paged" and ecfg.max_batched_tokens == DEFAULT_MAX_BATCHED_TOKENS
    assert spec.step().policy == "mixed"


def test_serve_budget_and_policy_flags_reach_the_engine_config(monkeypatch):
    spec = _spec_of(monkeypatch, "--max-batched-tokens", "1024", "--prefill-policy", "chunk")
    ecfg = spec.step().engine_config(max_slots=spec.max_slots, max_len=spec.max_len)
    assert (ecfg.max_batched_tokens, ecfg.prefill_policy) == (1024, "chunk")
    assert LaunchSpec.from_json(spec.to_json()) == spec  # the harness's child gets the same step


def test_serve_rejects_a_bad_policy_or_budget_naming_it():
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-a", "--prefill-policy", "ragged"])
    assert result.exit_code == 2 and "prefill_policy" in result.output
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-a", "--max-batched-tokens", "0"])
    assert result.exit_code == 2 and "max_batched_tokens" in result.output
    result = CliRunner().invoke(
        app, ["serve", "--model", "tiny-a", "--kv-layout", "contiguous", "--prefill-policy", "mixed"]
    )
    assert result.exit_code == 2 and "kv_layout paged" in result.output
