#!/usr/bin/env bash
# Prefix sharing on the served (mixed) step: one `serve --model small --max-slots 8`; at concurrency 4
# and 8, cold 200-token prompts, 16 agents sharing a 2,000-token system prompt (a lead agent first,
# then released together with --no-lead-agent), cold again so drift shows. ratios.txt: the shared
# agents' first-turn TTFT (those after the lead; all of them when released together) ÷ the cold
# prompts' at the same concurrency, and prompt tokens computed ÷ new; then 32 agents × 6 turns of
# 1,000-token inputs on a self-started server: later turns' cache hits. OUT: the run folder.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
OUT=${1:?run folder}; mkdir -p "$OUT"
PORT=${PORT:-18731}
g4bench serve --model small --port $PORT --max-slots 8 > $OUT/server.log 2>&1 &
SRV=$!
trap 'kill $SRV' EXIT
for i in $(seq 600); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
URL=http://127.0.0.1:$PORT
COMMON="--url $URL --input-len 200 --output-len 16 --num-requests 16"
for c in 4 8; do
  g4bench serve-load $COMMON --workload fixed --conc $c --seed 1$c --out $OUT/cold-a-c$c > $OUT/cold-a-c$c.log 2>&1
  g4bench serve-load $COMMON --workload shared-prefix --prefix-len 2000 --turns 2 --conc $c --seed 2$c --out $OUT/shared-c$c > $OUT/shared-c$c.log 2>&1
  g4bench serve-load $COMMON --workload shared-prefix --prefix-len 2000 --turns 2 --conc $c --seed 4$c --no-lead-agent --out $OUT/together-c$c > $OUT/together-c$c.log 2>&1
  g4bench serve-load $COMMON --workload fixed --conc $c --seed 3$c --out $OUT/cold-b-c$c > $OUT/cold-b-c$c.log 2>&1
done
kill $SRV; wait $SRV 2>/dev/null; trap - EXIT
# agents returning for more turns find their own history (a self-started server, 8 slots by default)
g4bench serve-load --model small --workload agent --conc 32 --num-requests 32 --turns 6 --input-len 1000 --output-len 16 --out $OUT/agent-reuse > $OUT/agent-reuse.log 2>&1
python - "$OUT" > $OUT/ratios.txt <<'PY'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])

def requests(name):
    return [json.loads(l) for l in (out / name / "requests.jsonl").open() if l.strip()]

def level(name):
    return json.loads((out / name / "summary.json").read_text())["levels"][0]

for c in (4, 8):
    cold = [r["ttft_ms"] for n in (f"cold-a-c{c}", f"cold-b-c{c}") for r in requests(n) if r["ok"]]
    cmed, cmax = statistics.median(cold), max(cold)
    print(f"c={c}: cold 200-token prompts (both runs, {len(cold)}): TTFT median {cmed:.0f} / max {cmax:.0f} ms")
    for name, who in ((f"shared-c{c}", "after the lead"), (f"together-c{c}", "released together")):
        lv, rs = level(name), requests(name)
        first = [r for r in rs if r["ok"] and r["turn"] == 0]
        lead = min(first, key=lambda r: r["send_s"]) if name.startswith("shared") else None
        rest = [r["ttft_ms"] for r in first if r is not lead]
        print(f"  {name}: first-turn TTFT {who} ({len(rest)}): median {statistics.median(rest):.0f} / max {max(rest):.0f} ms"
              f" → ÷ cold {statistics.median(rest) / cmed:.2f} / {max(rest) / cmax:.2f}"
              + (f"; lead {lead['ttft_ms']:.0f} ms" if lead else "")
              + f"; prompt tokens computed ÷ new {lv['computed_over_new_prompt_tokens']:.3f}")
later = [r for r in requests("agent-reuse") if r["ok"] and r["turn"]]
frac = [r["cached_tokens"] / r["prompt_tokens"] for r in later]
print(f"agent-reuse (32 agents, 6 turns of 1,000-token inputs): {sum(f >= 0.9 for f in frac)} of {len(later)} later turns "
      f"with ≥ 90% of the prompt cached (min {min(frac):.1%}); prompt tokens computed ÷ new "
      f"{level('agent-reuse')['computed_over_new_prompt_tokens']:.3f}")
PY
cat $OUT/ratios.txt
