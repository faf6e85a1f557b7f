"""The memory bandwidth probe as a covariate of the visit noise: re-judge every recorded separate-visit
revalidate run that read the probe, with the pooled noise alone and with the probe as its covariate
(harness/visit_noise.py), from the raw visits in each run's visits.jsonl.

Prints, per run: rounds, points, the pooled noise before and after the probe, the slope and residual
correlation, the F test's p that the configurations moved the probe, and the verdict counts
(faster/slower/equivalent/inconclusive) both ways; then, over all runs, how often each way calls a
null comparison (A/A pairs, PLE format) faster/slower and the donation and int8-KV effects faster.

Usage: python results/reference/session16/probe_covariate.py [RUN_DIR ...]   (default: every
results/reference/revalidate-cpu-* run whose visits read the probe)
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from harness.visit_noise import compare_pooled, pooled_noise

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parent
sys.path.insert(0, str(REFERENCE / "session15"))
from reanalyse import pairs, print_totals  # noqa: E402  (the effects re-judged, as session 15 paired them)

WORDS = ("faster", "slower", "equivalent", "inconclusive")


def load(run: Path) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]]]:
    """(name → samples by round, name → probe GB/s by round) for the points measured in every round."""
    steps: dict[str, dict[int, list[float]]] = collections.defaultdict(dict)
    probe: dict[str, dict[int, list[float]]] = collections.defaultdict(dict)
    for line in (run / "visits.jsonl").read_text().splitlines():
        visit = json.loads(line)
        if "step_ms_samples" in visit["result"]:
            steps[visit["name"]][visit["round"]] = visit["result"]["step_ms_samples"]
            probe[visit["name"]][visit["round"]] = visit["result"].get("host_mem_gbs") or []
    rounds = max((len(r) for r in steps.values()), default=0)
    keep = [n for n, r in steps.items() if len(r) == rounds]
    return {n: [steps[n][i] for i in range(rounds)] for n in keep}, {n: [probe[n][i] for i in range(rounds)] for n in keep}


def main(runs: list[Path]) -> None:
    totals: collections.Counter[str] = collections.Counter()
    print(f"{'run':38} {'R':>2} {'pts':>3} {'before':>6} {'after':>6} {'slope':>6} {'r':>5} {'p(cfg)':>6}  "
          "pooled f/s/e/i  +probe f/s/e/i")  # fmt: skip
    for run in runs:
        settings = json.loads((run / "env.json").read_text()).get("settings", {})
        if settings.get("visit", "separate") != "separate":
            continue
        steps, probe = load(run)
        plain, adjusted = pooled_noise(steps), pooled_noise(steps, probe=probe)
        if plain is None or adjusted is None or adjusted.probe is None:
            continue
        words: dict[str, collections.Counter[str]] = {"pooled": collections.Counter(), "+probe": collections.Counter()}
        for effect, a, b in pairs(list(steps)):
            for method, noise in (("pooled", plain), ("+probe", adjusted)):
                word = compare_pooled(a, b, noise, floor=0.02).word
                words[method][word] += 1
                kind = "null" if effect in ("aa", "ple") else effect
                totals[f"{kind} {method} n"] += 1
                totals[f"{kind} {method} called"] += word in ("faster", "slower")
                totals[f"{kind} {method} faster"] += word == "faster"
        c = adjusted.probe
        print(f"{run.name:38} {plain.rounds:>2} {plain.configurations:>3} {100 * plain.sigma:>5.1f}% "
              f"{100 * adjusted.sigma:>5.1f}% {c.slope:>+6.2f} {c.corr:>+5.2f} {c.config_effect_p:>6.3f}  "
              f"{'/'.join(str(words['pooled'][w]) for w in WORDS):14}  "
              f"{'/'.join(str(words['+probe'][w]) for w in WORDS)}")  # fmt: skip
    print()
    print_totals(totals, ("pooled", "+probe"))


if __name__ == "__main__":
    given = [Path(p) for p in sys.argv[1:]]
    main(given or sorted(p for p in REFERENCE.glob("revalidate-cpu-*") if (p / "visits.jsonl").exists()))
