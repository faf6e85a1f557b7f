"""Re-judge every recorded revalidate run (separate visits) with the pooled visit noise and with the
hierarchical bootstrap, from the raw samples in each run's visits.jsonl.

Prints, per run: rounds, points, the pooled visit noise (sd of a visit's log median after
configuration and round effects) and the comparisons' verdict counts under both methods; then, over
all runs, how often each method calls a *null* comparison faster/slower — A/A pairs, and the PLE
format effect (the PLE table is gathered, a few KB a step: its true effect on the step is ~0) — and
how often it calls the donation and int8-KV effects faster. Writes noise_by_kind.txt beside itself:
the residual sd by kind of configuration (is the visit noise the same for every configuration?).

Usage: python results/reference/session15/reanalyse.py [RUN_DIR ...]   (default: every
results/reference/revalidate-cpu-* run with a visits.jsonl)
"""

from __future__ import annotations

import collections
import json
import math
import sys
from pathlib import Path

import numpy as np
from harness.compare import compare_rounds
from harness.visit_noise import compare_pooled, pooled_noise

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parent


def load(run: Path) -> dict[str, list[list[float]]]:
    """name → samples by round, for the points measured in every round of the run."""
    by: dict[str, dict[int, list[float]]] = collections.defaultdict(dict)
    for line in (run / "visits.jsonl").read_text().splitlines():
        visit = json.loads(line)
        if "step_ms_samples" in visit["result"]:
            by[visit["name"]][visit["round"]] = visit["result"]["step_ms_samples"]
    rounds = max((len(r) for r in by.values()), default=0)
    return {n: [r[i] for i in range(rounds)] for n, r in by.items() if len(r) == rounds}


def pairs(names: list[str]) -> list[tuple[str, str, str]]:
    """(effect, reference, variant) for A/A pairs, PLE, donation and int8-KV effects."""
    out = []
    for n in names:
        if n.startswith("aa") and n.endswith("-A") and n[:-2] + "-B" in names:
            out.append(("aa", n, n[:-2] + "-B"))
        if n.startswith("ple-bf16/"):
            out += [("ple", n, m) for q in ("int8", "int4") if (m := n.replace("ple-bf16/", f"ple-{q}/", 1)) in names]
        if "copying" in n and (m := n.replace("copying", "donated")) in names:
            out.append(("donation", n, m))
        if "/kv-bf16/" in n and (m := n.replace("/kv-bf16/", "/kv-int8/")) in names:
            out.append(("kv-int8", n, m))
    return out


def print_totals(totals: collections.Counter[str], methods: tuple[str, ...]) -> None:
    """Over all runs, per method: null comparisons called faster/slower, donation and int8 KV called faster."""
    for kind in ("null", "donation", "kv-int8"):
        for method in methods:
            n = totals[f"{kind} {method} n"]
            if n:
                what = "called faster/slower" if kind == "null" else "called faster"
                k = totals[f"{kind} {method} called"] if kind == "null" else totals[f"{kind} {method} faster"]
                print(f"{kind:9} {method:9}: {k:3} of {n:3} {what} ({100 * k / n:.1f}%)")


def main(runs: list[Path]) -> None:
    totals: collections.Counter[str] = collections.Counter()
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    print(f"{'run':44} {'R':>2} {'pts':>3} {'noise%':>6}  pooled f/s/e/i     bootstrap f/s/e/i")
    for run in runs:
        settings = json.loads((run / "env.json").read_text()).get("settings", {})
        if settings.get("visit", "separate") != "separate":
            continue
        data = load(run)
        noise = pooled_noise(data)
        if noise is None:
            continue
        words: dict[str, collections.Counter[str]] = {"pooled": collections.Counter(), "bootstrap": collections.Counter()}
        for effect, a, b in pairs(list(data)):
            pooled = compare_pooled(a, b, noise, floor=0.02).word
            boot = compare_rounds(data[a], data[b], floor=0.02).word
            words["pooled"][pooled] += 1
            words["bootstrap"][boot] += 1
            for method, word in (("pooled", pooled), ("bootstrap", boot)):
                kind = "null" if effect in ("aa", "ple") else effect
                totals[f"{kind} {method} n"] += 1
                totals[f"{kind} {method} called"] += word in ("faster", "slower")
                totals[f"{kind} {method} faster"] += word == "faster"
        y = np.array([noise.visit_logs[n] for n in data])
        resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
        for n, row in zip(data, resid, strict=True):
            if not n.startswith("aa"):
                kind = ("copying" if "copying" in n else "donated") + ("/kv-int8" if "kv-int8" in n else "/kv-bf16")
                by_kind[kind].append(float((row**2).sum() * y.shape[0] / noise.df))
        fmt = lambda c: "/".join(str(c[w]) for w in ("faster", "slower", "equivalent", "inconclusive"))  # noqa: E731
        print(f"{run.name:44} {noise.rounds:>2} {noise.configurations:>3} {100 * noise.sigma:>6.1f}  "
              f"{fmt(words['pooled']):17} {fmt(words['bootstrap'])}")  # fmt: skip
    print()
    print_totals(totals, ("pooled", "bootstrap"))
    lines = [f"{kind:18} residual sd {100 * math.sqrt(np.mean(v)):.1f}% over {len(v)} configuration-runs"
             for kind, v in sorted(by_kind.items())]  # fmt: skip
    (HERE / "noise_by_kind.txt").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    given = [Path(p) for p in sys.argv[1:]]
    main(given or sorted(p for p in REFERENCE.glob("revalidate-cpu-*") if (p / "visits.jsonl").exists()))
