#!/usr/bin/env bash
# Issue 14 must-show: shared 2,000-token system prompt over 16 agents vs cold 200-token prompts, one server,
# cold / shared / cold at each concurrency so drift shows. MODEL picks the model (default small),
# SERVE_ARGS adds server flags, TURNS the turns per agent (default 2), PORT picks the port, HEALTH_WAIT_S bounds the wait for warm-up.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-results/i14-ttft}
mkdir -p $OUT
PORT=${PORT:-18731}
g4bench serve --model ${MODEL:-small} --port $PORT --max-slots 8 ${SERVE_ARGS:-} > $OUT/server.log 2>&1 &
SRV=$!
trap 'kill $SRV' EXIT
for i in $(seq ${HEALTH_WAIT_S:-600}); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 1; done
URL=http://127.0.0.1:$PORT
for c in 4 8; do
  g4bench serve-load --url $URL --workload fixed --input-len 200 --output-len 16 --num-requests 16 --conc $c --seed 1$c --out $OUT/cold-a-c$c > $OUT/cold-a-c$c.log 2>&1
  g4bench serve-load --url $URL --workload shared-prefix --prefix-len 2000 --input-len 200 --output-len 16 --turns ${TURNS:-2} --num-requests 16 --conc $c --seed 2$c --out $OUT/shared-c$c > $OUT/shared-c$c.log 2>&1
  g4bench serve-load --url $URL --workload fixed --input-len 200 --output-len 16 --num-requests 16 --conc $c --seed 3$c --out $OUT/cold-b-c$c > $OUT/cold-b-c$c.log 2>&1
done
