#!/usr/bin/env bash
# The simulator's validation on the served (mixed) step, back to back on a quiet host: engine-level fit
# and held-out runs, serve-load fixed and agent, the profile fit, then plan --validate. Q: a scratch folder.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
Q=${1:?scratch folder}; mkdir -p "$Q"
stamp() { date -u +%H:%M:%S; }
echo "$(stamp) engine-steps fit"; g4bench engine-steps --max-slots 1,2,4,8 --max-len 256,512,2048 --out $Q/engine-fit > $Q/engine-fit.log 2>&1
echo "$(stamp) engine-steps holdout"; g4bench engine-steps --max-slots 3,6 --max-len 1024 --out $Q/engine-holdout > $Q/engine-holdout.log 2>&1
echo "$(stamp) serve fixed"; g4bench serve-load --workload fixed --conc 1,2,4,8 --num-requests 16 --out $Q/serve-fixed > $Q/serve-fixed.log 2>&1
echo "$(stamp) serve agent"; g4bench serve-load --workload agent --conc 1,2,4,8 --num-requests 8 --out $Q/serve-agent > $Q/serve-agent.log 2>&1
echo "$(stamp) calibrate"; g4bench calibrate $Q/engine-fit --holdout $Q/engine-holdout --device cpu-2core-dev --out $Q/cpu-2core-engine.toml > $Q/calibrate.log 2>&1
echo "$(stamp) validate"; g4bench plan --validate $Q/serve-fixed --validate $Q/serve-agent --profile $Q/cpu-2core-engine.toml --out $Q/validate > $Q/validate.log 2>&1
echo "$(stamp) done"
