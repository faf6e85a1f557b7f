#!/usr/bin/env bash
# Session 8: the v6e paged vs contiguous ceilings again, after the cache stores 16-bit floats as bits
# (paged_hlo_tpu.txt: the TPU programs' bytes and temps fell too).
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
R=results/reference
S=$R/session8
date -u +"%T run5 start" >> $S/run.log
g4bench capacity --ctx 8192 --target tpu-v6e --kv-dtype bf16 --step donated --sliding-kv full \
  --kv-layout contiguous,paged --out $R/capacity-tpu-v6e-layouts-s8 > $S/capacity-layouts.log 2>&1
date -u +"%T capacity layouts done" >> $S/run.log
