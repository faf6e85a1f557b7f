"""The burst-prefill check: what a burst of prompts costs the prompts and the streams already running.

    result = run_burst(BurstSettings(model="small", policies=("mixed", "chunk")), out, log)

Shape (the issue's): a server with 16 slots; two streams decode (long outputs, `ignore_eos`); once
both stream, 8 prompts of 200 fresh token ids arrive together (`max_tokens` 8). Measured per
prefill policy, each on its own freshly started server (harness/load/server.py), in one run:

- the lone cold prompt's TTFT (the median of `lone` single 200-token prompts sent alone, each of
  fresh tokens, after warm-up), the burst prompts' TTFTs in arrival order of their first tokens,
  and the ratio of the last to the lone one (bar: ≤ 6× with the default token budget);
- the same single prompts sent one at a time while the streams decode (before the burst): the
  control for what the burst adds over one arrival into the same running server (printed beside
  the bar's ratio, which divides by the idle server's lone prompt);
- the running streams' inter-token gaps: the largest gap that overlaps the burst (from the burst's
  send to its last first token) against the streams' median gap before those prompts (bar: ≤ 5×).

Each server runs `rounds` such rounds (lone prompts on the idle server, streams, loaded prompts,
burst); a policy's figures are the medians over its rounds, with the bar ratios' [min, max] and
every round kept in burst.json (`round_figures` per round, `combine` across them): one burst is not
a figure on a shared host (docs/findings.md §1.6).

Every time is client-side over HTTP (`stream_request`), so it includes what a user sees.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
import typer

from harness.load.client import RequestRecord, RequestSpec, stream_request


@dataclass(frozen=True)
class BurstSettings:
    model: str = "small"
    policies: tuple[str, ...] = ("mixed", "chunk")
    max_slots: int = 16
    max_len: int = 2048
    max_batched_tokens: int = 512
    burst: int = 8
    prompt_len: int = 200
    streams: int = 2
    stream_tokens: int = 600
    lone: int = 3
    lead_s: float = 3.0
    seed: int = 0
    timeout_s: float = 600.0
    rounds: int = 3


def fresh_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 250) for _ in range(n)]


def prompt_spec(model: str, ids: list[int], max_tokens: int, rid: str) -> RequestSpec:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "min_tokens": max_tokens, "return_token_ids": True}  # fmt: skip
    return RequestSpec("/v1/completions", body, rid, input_len=len(ids), prompt_ids=ids)


def _gaps(rec: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times relative to run start [n], gaps [n−1]) of a stream's output chunks."""
    at = rec.send_s + np.asarray(rec.chunk_times)
    return at, np.diff(at)


@dataclass(frozen=True)
class RoundRecords:
    """One round's requests: the idle server's lone prompts, the same prompts beside the running
    streams (`loaded`), the burst, the streams; `loaded_send` / `burst_send` when those began
    (seconds from the run's start, as every record's `send_s`)."""

    lone: list[RequestRecord]
    loaded: list[RequestRecord]
    burst: list[RequestRecord]
    streams: list[RequestRecord]
    loaded_send: float
    burst_send: float


async def _measure(base_url: str, s: BurstSettings, rng: random.Random) -> list[RoundRecords]:
    """`s.rounds` rounds against one server, each: lone prompts, streams started, their lead, the
    loaded prompts, the burst, then the streams to their end."""
    t0 = time.perf_counter()
    rounds = []
    async with httpx.AsyncClient(timeout=s.timeout_s) as client:

        async def send(spec: RequestSpec) -> RequestRecord:
            return await stream_request(client, base_url, spec, t0=t0, scheduled_s=time.perf_counter() - t0,
                                        timeout_s=s.timeout_s)  # fmt: skip

        def prompt(rid: str, max_tokens: int = 8) -> RequestSpec:
            return prompt_spec(s.model, fresh_ids(rng, s.prompt_len), max_tokens, rid)

        await send(prompt("warm", 4))  # the first request's host paths
        for k in range(s.rounds):
            lone = [await send(prompt(f"r{k}-lone{i}")) for i in range(s.lone)]
            streams = [asyncio.create_task(send(prompt_spec(s.model, fresh_ids(rng, 16), s.stream_tokens,
                                                            f"r{k}-stream{i}")))
                       for i in range(s.streams)]  # fmt: skip
            await asyncio.sleep(s.lead_s)  # the streams run alone first: their before-burst gaps
            loaded_send = time.perf_counter() - t0
            # the same single prompts while the streams decode: a burst of one into the same server
            loaded = [await send(prompt(f"r{k}-loaded{i}")) for i in range(s.lone)]
            burst_send = time.perf_counter() - t0
            burst = await asyncio.gather(*(send(prompt(f"r{k}-burst{i}")) for i in range(s.burst)))
            running = await asyncio.gather(*streams)
            rounds.append(RoundRecords(lone, loaded, list(burst), list(running), loaded_send, burst_send))
    return rounds


def round_figures(r: RoundRecords) -> dict[str, Any]:
    """One round's figures: TTFTs (ms), the bar's ratios, the streams' gaps (see the module docstring).
    Raises if a request failed or the streams left too few gaps to judge."""
    failed = [x.request_id for x in [*r.lone, *r.loaded, *r.burst, *r.streams] if not x.ok]
    if failed:
        raise RuntimeError(f"requests failed: {', '.join(failed)}")
    lone_ttft = float(np.median([x.chunk_times[0] for x in r.lone]))
    loaded_ttft = float(np.median([x.chunk_times[0] for x in r.loaded]))
    ttfts = sorted(x.chunk_times[0] for x in r.burst)
    burst_end = max(x.send_s + x.chunk_times[0] for x in r.burst)
    before, during = [], []
    for x in r.streams:
        at, gaps = _gaps(x)
        before += gaps[at[1:] < r.loaded_send].tolist()
        # a gap overlaps the burst when it ends after the send and starts before the last first token
        during += gaps[(at[1:] > r.burst_send) & (at[:-1] < burst_end)].tolist()
    if len(before) < 5 or not during:
        hint = "" if during else "; the streams ended before the burst: raise --stream-tokens"
        raise RuntimeError(
            f"too few stream gaps to judge ({len(before)} before, {len(during)} during the burst){hint}"
        )
    median_gap = float(np.median(before))
    return {
        "lone_ttft_ms": 1e3 * lone_ttft,
        "burst_ttft_ms": [1e3 * t for t in ttfts],
        "last_over_lone": ttfts[-1] / lone_ttft,
        "lone_beside_streams_ttft_ms": 1e3 * loaded_ttft,
        "last_over_lone_beside_streams": ttfts[-1] / loaded_ttft,
        "stream_median_gap_ms": 1e3 * median_gap,
        "stream_max_gap_during_burst_ms": 1e3 * max(during),
        "max_gap_over_median": max(during) / median_gap,
    }


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds' figures → the policy's: each figure's median over rounds (the burst's TTFTs those of
    the round with the median ratio), the two bar ratios' [min, max], and every round as measured."""
    if not rounds:
        raise ValueError("no rounds to combine")
    scalars = [k for k, v in rounds[0].items() if not isinstance(v, list)]
    out: dict[str, Any] = {k: float(np.median([r[k] for r in rounds])) for k in scalars}
    ratios = [r["last_over_lone"] for r in rounds]
    middle = sorted(range(len(rounds)), key=lambda i: ratios[i])[(len(rounds) - 1) // 2]
    out["burst_ttft_ms"] = rounds[middle]["burst_ttft_ms"]
    for k in ("last_over_lone", "max_gap_over_median"):
        out[f"{k}_range"] = [min(r[k] for r in rounds), max(r[k] for r in rounds)]
    out["rounds"] = rounds
    return out


def run_burst(s: BurstSettings, out: Path, log: Any = print) -> dict[str, Any]:
    """Each policy on a fresh server; returns {settings, policies: {policy: figures or failure}}
    and writes it to out/burst.json (a failed policy is recorded and the next one still runs)."""
    from g4bench.server.launch import LaunchSpec
    from harness.load.server import ManagedServer, free_port

    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"settings": asdict(s), "policies": {}}
    for policy in s.policies:
        port = free_port()
        spec = LaunchSpec(model=s.model, max_slots=s.max_slots, max_len=s.max_len, host="127.0.0.1", port=port,
                          prefill_policy=policy, max_batched_tokens=s.max_batched_tokens)  # fmt: skip
        server = ManagedServer([sys.executable, "-m", "g4bench.server.launch", spec.to_json()], port,
                               out / f"server-{policy}.log")  # fmt: skip
        log(f"burst: starting the {policy} server (warm-up compiles every shape) …")
        try:
            server.start()
            rounds = asyncio.run(_measure(server.base_url, s, random.Random(s.seed)))
            figures = combine([round_figures(r) for r in rounds])
        except Exception as exc:  # noqa: BLE001 -- recorded in burst.json; the other policy still runs
            figures = {"failure": f"{type(exc).__name__}: {exc}"}
        finally:
            server.stop()
        result["policies"][policy] = figures
        log(f"burst [{policy}]: {summary_line(figures)}")
        (out / "burst.json").write_text(json.dumps(result, indent=2))
    return result


def summary_line(f: dict[str, Any]) -> str:
    if "failure" in f:
        return f"FAILED {f['failure']}"
    ttfts = ", ".join(f"{t:.0f}" for t in f["burst_ttft_ms"])
    n = len(f.get("rounds", [])) or 1

    def spread(key: str) -> str:
        return f" [{f[key][0]:.2f}–{f[key][1]:.2f} over {n} rounds]" if key in f and n > 1 else ""

    beside = ""
    if "lone_beside_streams_ttft_ms" in f:
        beside = (f" (÷ a lone prompt beside the same streams, {f['lone_beside_streams_ttft_ms']:.0f} ms: "
                  f"{f['last_over_lone_beside_streams']:.2f}×)")  # fmt: skip
    return (f"lone cold TTFT {f['lone_ttft_ms']:.0f} ms; burst TTFTs {ttfts} ms; last ÷ lone "
            f"{f['last_over_lone']:.2f}×{spread('last_over_lone_range')}{beside}; streams' largest gap in the "
            f"burst {f['stream_max_gap_during_burst_ms']:.0f} ms = {f['max_gap_over_median']:.2f}×"
            f"{spread('max_gap_over_median_range')} their median {f['stream_median_gap_ms']:.0f} ms"
            + (" (medians over rounds)" if n > 1 else ""))  # fmt: skip


def main(
    out: Path = Path("results/burst-prefill"),
    model: str = "small",
    policies: str = "mixed,chunk",
    max_batched_tokens: int = 512,
    rounds: Annotated[int, typer.Option(min=1)] = BurstSettings.rounds,
    stream_tokens: Annotated[int, typer.Option(min=8)] = BurstSettings.stream_tokens,
) -> None:
    """`python -m harness.load.burst`: both policies from one run, figures printed and in out/burst.json."""
    settings = BurstSettings(
        model=model, policies=tuple(policies.split(",")), max_batched_tokens=max_batched_tokens, rounds=rounds,
        stream_tokens=stream_tokens,
    )  # fmt: skip
    result = run_burst(settings, out)
    if any("failure" in f for f in result["policies"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    typer.run(main)
