#!/usr/bin/env bash
# Session 8: after every cache layout stores 16-bit floats as uint16 bits (kv_cache.stored_dtype).
# 1. compiled CPU decode steps by layout; 2. issue 9's donation must-show ×3 (CPU defaults);
# 3. the decode step by layout, donated, b8/b32 ctx 8192; 4. revalidate --all once.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
R=results/reference
S=$R/session8
date -u +"%T start" >> $S/run.log
python $R/session6/paged_hlo.py local > $S/paged_hlo_local.txt 2>/dev/null
date -u +"%T hlo done" >> $S/run.log
for i in 1 2 3; do
  g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 32 --ctx 8192 \
    --out $R/revalidate-cpu-small-donation-s8-$i > $S/donation-$i.log 2>&1
  date -u +"%T donation $i done" >> $S/run.log
done
g4bench revalidate --model small --config ple-bf16/kv-bf16/donated --batch 8,32 --ctx 8192 \
  --kv-layout contiguous,paged --rounds 4 --samples 6 --out $R/revalidate-cpu-small-layouts-s8 > $S/layouts.log 2>&1
date -u +"%T layouts done" >> $S/run.log
g4bench revalidate --all --out $R/revalidate-cpu-e2b-s8 > $S/all.log 2>&1
date -u +"%T all done" >> $S/run.log
