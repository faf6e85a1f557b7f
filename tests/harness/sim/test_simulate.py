"""The simulator on hand-checkable prices: TTFT / TPOT / E2E follow from the priced calls exactly,
agent turns reuse their history, open-loop arrivals are honoured, and the summary is serve-load's."""

from __future__ import annotations

import math

import pytest

from harness.load.report import build_summary
from harness.load.runner import LoadConfig
from harness.load.workloads import WorkloadConfig
from harness.sim.simulate import ServerShape, simulate

PREFILL_S, DECODE_S = 0.100, 0.010


def price(call):
    return PREFILL_S if call.program in ("prefill", "mixed") else DECODE_S


def shape(slots: int = 1, max_len: int = 128, policy: str = "chunk") -> ServerShape:
    """The hand arithmetic below is the chunk policy's (one prefill chunk per loop turn beside a
    decode call); test_mixed_policy_prefills_beside_the_decode_rows checks the mixed one."""
    return ServerShape(model="tiny-a", max_slots=slots, max_len=max_len, kv_dtype="f32", sliding_kv="full",
                       chunk_size=32, prefill_policy=policy)  # fmt: skip


def run(kind: str = "fixed", conc=(1,), tasks: int = 2, slots: int = 1, rate: float = math.inf,
        policy: str = "chunk", **wl):  # fmt: skip
    workload = WorkloadConfig(kind=kind, input_len=16, output_len=4, turns=3, tool_result_tokens=8, **wl)
    cfg = LoadConfig(
        base_url="simulated", workload=workload, concurrencies=list(conc), num_tasks=tasks, rate=rate
    )
    return simulate(cfg, shape(slots, policy=policy), price)


def test_mixed_policy_prefills_beside_the_decode_rows():
    """Mixed (priced as a prefill): two streams sent at 0 prefill together in one call, then
    decode together: first tokens both at 0.10, the rest every 0.01."""
    result, engines = run(conc=(2,), slots=2, policy="mixed")
    first, second = sorted(result.levels[0].records, key=lambda r: r.chunk_times[0])[:2]
    assert first.chunk_times == pytest.approx([0.10, 0.11, 0.12, 0.13])
    assert second.chunk_times == pytest.approx(first.chunk_times)
    assert [c.program for c in engines[0].calls][:2] == ["mixed", "decode"]


def test_fixed_requests_back_to_back_match_hand_arithmetic():
    result, engines = run()
    a, b = result.levels[0].records
    # one chunk of prefill samples token 1; three decode steps give tokens 2..4
    assert a.chunk_times == pytest.approx([0.10, 0.11, 0.12, 0.13])
    assert a.send_s == 0.0 and b.send_s == pytest.approx(0.13)  # closed loop: sent as the reply ends
    assert b.chunk_times == pytest.approx(a.chunk_times)
    assert result.levels[0].duration_s == pytest.approx(0.26)
    s = build_summary(result, {"env": {}})["levels"][0]
    assert s["median_ttft_ms"] == pytest.approx(100.0)
    assert s["median_tpot_ms"] == pytest.approx(10.0)
    assert s["median_e2el_ms"] == pytest.approx(130.0)
    assert [c.program for c in engines[0].calls] == ["prefill", "decode", "decode", "decode"] * 2


def test_two_streams_share_decode_steps_and_queue_prefills():
    result, _ = run(conc=(2,), slots=2)
    first, second = sorted(result.levels[0].records, key=lambda r: r.chunk_times[0])[:2]
    # both sent at 0: the second prefill waits for the first (one chunk per loop turn), and the
    # first stream's decode step runs before it
    assert first.chunk_times[0] == pytest.approx(0.10)
    assert second.chunk_times[0] == pytest.approx(0.10 + 0.01 + 0.10)


def test_a_send_at_a_busy_boundary_waits_for_the_next_call():
    # three streams started at 0 (prefill A, decode A + prefill B, decode A,B + prefill C); the decode
    # at 0.33 gives A its 4th token, and A's client sends D then. The server's engine thread is already
    # in the next decode (B, C) when D reaches it, so D is admitted after that decode, prefilled after
    # the one following: first token at 0.33 + 0.01 + 0.01 + 0.10. (Admitting D at the 0.33 boundary
    # itself would give 0.11: the simulator used to, and under-predicted TTFT under load.)
    result, engines = run(conc=(3,), tasks=4, slots=3)
    d = max(result.levels[0].records, key=lambda r: r.send_s)
    assert d.send_s == pytest.approx(0.33)
    assert d.chunk_times[0] == pytest.approx(0.12)
    programs = [(c.program, c.active) for c in engines[0].calls]
    assert programs[6:10] == [("decode", 2), ("decode", 1), ("prefill", 0), ("decode", 1)]


def test_agent_turns_reuse_the_conversation():
    result, _ = run(kind="agent", tasks=1)
    turns = sorted(result.levels[0].records, key=lambda r: r.turn)
    assert [r.turn for r in turns] == [0, 1, 2]
    assert turns[0].cached_tokens == 0
    for prev, cur in zip(turns, turns[1:], strict=False):
        assert cur.prompt_tokens == prev.prompt_tokens + 4 + 8
        # the previous prompt and all but the last reply token are resident; reuse is whole 16-token blocks
        assert cur.cached_tokens == (prev.prompt_tokens + 3) // 16 * 16 > 0
    s = build_summary(result, {"env": {}})
    assert (
        s["levels"][0]["task_slo_attainment"] is not None and s["capacity"]["basis"] == "task_slo_attainment"
    )


@pytest.mark.parametrize("lead", [True, False])
def test_shared_prefix_lead_agent_opens_the_level(lead: bool):
    # as serve-load's runner: with a lead agent the other workers send when its first turn has ended
    result, _ = run(kind="shared-prefix", conc=(3,), tasks=3, slots=3, prefix_len=16, lead_agent=lead)
    firsts = sorted((r for r in result.levels[0].records if r.turn == 0), key=lambda r: r.send_s)
    if lead:
        assert all(r.send_s == pytest.approx(firsts[0].end_s) for r in firsts[1:])
        assert all(r.cached_tokens >= 16 for r in firsts[1:])  # the shared prompt was resident
    else:
        assert [r.send_s for r in firsts] == [0.0, 0.0, 0.0]


def test_open_loop_sends_at_arrival_times():
    result, _ = run(conc=(4,), tasks=3, slots=4, rate=0.5)
    sends = sorted(r.send_s for r in result.levels[0].records)
    assert sends[0] == 0.0 and sends[1] > 0.5  # gamma gaps with mean 2 s (seeded)
    assert all(r.queue_s == 0.0 for r in result.levels[0].records)  # never more than 4 in flight


def test_chat_transport_is_refused():
    cfg = LoadConfig(base_url="s", workload=WorkloadConfig(kind="fixed", api="chat"), concurrencies=[1])
    with pytest.raises(ValueError, match="token-id"):
        simulate(cfg, shape(), price)
