#!/usr/bin/env bash
# plan-from-main-job: the main job's sweep (revalidate defaults: the served step) feeds plan.
set -x
D=${1:?run folder}
cd "$(git rev-parse --show-toplevel)"
g4bench revalidate --model small --config ple-bf16/kv-bf16/donated --batch 1,4,8 --ctx 512,1024 --out $D/revalidate > $D/revalidate.log 2>&1
g4bench calibrate $D/revalidate --device cpu-main-job --out $D/main-job-decode.toml > $D/calibrate-decode.log 2>&1
g4bench engine-steps --model small --kv-dtype bf16 --max-slots 1,4,8 --max-len 1024 --out $D/engine-steps > $D/engine-steps.log 2>&1
g4bench calibrate $D/revalidate $D/engine-steps --device cpu-main-job --out $D/main-job.toml > $D/calibrate.log 2>&1
g4bench serve-load --workload fixed --conc 3,6 --input-len 300 --output-len 48 --out $D/serve-fixed > $D/serve.log 2>&1
g4bench plan --validate $D/serve-fixed --profile $D/main-job-decode.toml --out $D/plan-decode-only > $D/plan-decode-only.log 2>&1
g4bench plan --validate $D/serve-fixed --profile $D/main-job.toml --out $D/plan-main-job > $D/plan-main-job.log 2>&1
g4bench calibrate $D/engine-steps --device cpu-2core-dev --out $D/engine-steps.toml > $D/calibrate-engine-steps.log 2>&1
g4bench plan --validate $D/serve-fixed --profile $D/engine-steps.toml --out $D/plan-engine-steps-only > $D/plan-engine-steps-only.log 2>&1
echo done
