"""Issue 14's TTFT must-show, read from one prefix-share-ttft run folder (run.sh beside it).

    python results/reference/session7/ttft_ratio.py results/reference/prefix-share-ttft-cpu-small-s7

Per concurrency: first-turn TTFT of the lead agent (computes the 2,000-token system prompt) and of
the 15 agents after it, against the cold 200-token prompts sent at the same concurrency before
(cold-a) and after (cold-b) on the same server; ratios of medians and of maxima to the cold runs'
pooled median and max, and against a lone cold prompt (the first request of each cold run, sent
before any other is queued).
"""

import json
import sys
from pathlib import Path

import numpy as np


def records(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "requests.jsonl").open()]
    return sorted((r for r in rows if r["ok"]), key=lambda r: r["send_s"])


root = Path(sys.argv[1])
for c in (4, 8):
    shared = records(root / f"shared-c{c}")
    firsts = [r for r in shared if r["turn"] == 0]
    lead, rest = firsts[0], [r["ttft_ms"] for r in firsts[1:]]
    colds = [records(root / f"cold-{ab}-c{c}") for ab in "ab"]
    cold = [r["ttft_ms"] for rs in colds for r in rs]
    alone = [rs[0]["ttft_ms"] for rs in colds]
    cached = [r["cached_tokens"] for r in firsts[1:]]
    print(
        f"conc {c}: lead {lead['ttft_ms']:.0f} ms (cached {lead['cached_tokens']}); "
        f"rest n={len(rest)} median {np.median(rest):.0f} max {max(rest):.0f} ms (cached {min(cached)}–{max(cached)}); "
        f"cold 200-token at conc {c}: median {np.median(cold):.0f} max {max(cold):.0f} ms; "
        f"rest ÷ cold: median {np.median(rest) / np.median(cold):.2f}, max {max(rest) / max(cold):.2f}; "
        f"lone cold prompt {np.mean(alone):.0f} ms → rest max ÷ lone {max(rest) / np.mean(alone):.2f}"
    )
