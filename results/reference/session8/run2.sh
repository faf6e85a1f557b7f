#!/usr/bin/env bash
# Session 8, second batch (nothing else running): issue 9's donation must-show ×3 again; issue 14's
# TTFT floor in process (prefill_probe.py, small then e2b); the TPU v6e compile of both layouts.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
R=results/reference
S=$R/session8
date -u +"%T run2 start" >> $S/run.log
for i in 4 5 6; do
  g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 32 --ctx 8192 \
    --out $R/revalidate-cpu-small-donation-s8-$i > $S/donation-$i.log 2>&1
  date -u +"%T donation $i done" >> $S/run.log
done
python $S/prefill_probe.py small 7 > $S/prefill_probe.txt 2>$S/prefill_probe.err
python $S/prefill_probe.py e2b 5 >> $S/prefill_probe.txt 2>>$S/prefill_probe.err
date -u +"%T probes done" >> $S/run.log
TPU_SKIP_MDS_QUERY=1 JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 \
  python $R/session6/paged_hlo.py tpu-v6e > $S/paged_hlo_tpu.txt 2>/dev/null
date -u +"%T tpu hlo done" >> $S/run.log
