"""The burst check's figures from synthetic records: which stream gaps count, the ratios, rounds."""

from dataclasses import replace

import pytest

from harness.load.burst import RoundRecords, combine, round_figures, summary_line
from harness.load.client import RequestRecord


def _rec(rid: str, send_s: float, chunk_times: list[float], ok: bool = True) -> RequestRecord:
    return RequestRecord(rid, "/v1/completions", send_s=send_s, chunk_times=chunk_times, ok=ok)


def _round(burst_ttfts=(0.3, 0.3, 0.5, 0.9), stall: float = 0.4, lone: float = 0.1) -> RoundRecords:
    """Streams emit every 50 ms from t=0 to 4 s, except one `stall` gap that starts at 2.2 s; the
    loaded prompts go at 1.0 s, the burst at 2.0 s."""
    times, t = [], 0.0
    while t < 4.0:
        times.append(t)
        t += stall if abs(t - 2.2) < 1e-9 else 0.05
        t = round(t, 6)
    streams = [_rec(f"stream{i}", 0.0, times) for i in range(2)]
    return RoundRecords(
        lone=[_rec("lone0", 0.0, [lone]), _rec("lone1", 0.0, [lone * 3]), _rec("lone2", 0.0, [lone])],
        loaded=[_rec("loaded0", 1.0, [0.2])],
        burst=[_rec(f"burst{i}", 2.0, [x]) for i, x in enumerate(burst_ttfts)],
        streams=streams,
        loaded_send=1.0,
        burst_send=2.0,
    )


def test_round_figures_divide_the_last_first_token_by_the_median_lone_prompt():
    f = round_figures(_round())
    assert f["lone_ttft_ms"] == pytest.approx(100.0)  # the median, not the slow one
    assert f["burst_ttft_ms"] == pytest.approx([300, 300, 500, 900])
    assert f["last_over_lone"] == pytest.approx(9.0)
    assert f["last_over_lone_beside_streams"] == pytest.approx(4.5)


def test_only_gaps_overlapping_the_burst_count_against_the_median_before_it():
    f = round_figures(_round(stall=0.4))
    assert f["stream_median_gap_ms"] == pytest.approx(50.0)
    assert f["stream_max_gap_during_burst_ms"] == pytest.approx(400.0)
    assert f["max_gap_over_median"] == pytest.approx(8.0)
    # the same stall after the burst's last first token (2.0 + 0.2 s) is not the burst's
    late = round_figures(_round(burst_ttfts=(0.1, 0.15), stall=0.4))
    assert late["max_gap_over_median"] == pytest.approx(1.0)


def test_a_failed_request_or_too_few_gaps_is_an_error_naming_it():
    r = _round()
    r.burst[1].ok = False
    with pytest.raises(RuntimeError, match="burst1"):
        round_figures(r)
    short = replace(_round(), streams=[_rec("stream0", 0.0, [0.0, 0.05, 0.1, 2.1, 2.5])])
    with pytest.raises(RuntimeError, match="too few stream gaps"):
        round_figures(short)
    ended = replace(_round(), streams=[_rec("stream0", 0.0, [0.05 * i for i in range(30)])])
    with pytest.raises(RuntimeError, match="ended before the burst: raise --stream-tokens"):
        round_figures(ended)


def test_rounds_combine_to_medians_with_the_spread_and_every_round_kept():
    rounds = [round_figures(_round(burst_ttfts=(0.3, x))) for x in (0.6, 0.9, 0.7)]
    f = combine(rounds)
    assert f["last_over_lone"] == pytest.approx(7.0)
    assert f["last_over_lone_range"] == pytest.approx([6.0, 9.0])
    assert f["burst_ttft_ms"] == pytest.approx([300, 700])  # the median round's own TTFTs
    assert len(f["rounds"]) == 3
    line = summary_line(f)
    assert "7.00×" in line and "6.00–9.00 over 3 rounds" in line and "medians over rounds" in line
    with pytest.raises(ValueError, match="no rounds"):
        combine([])
