#!/usr/bin/env bash
# Session 7: after paged pools store 16-bit floats as uint16 bits (kv_cache.stored_dtype).
# 1. the compiled CPU decode steps by layout; 2. issue 14's TTFT must-show again (lead agent on);
# 3. the decode step by layout, donated, b8/b32 ctx 8192, separate visits.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
R=results/reference
S=$R/session7
date -u +"%T start" >> $S/run.log
python $R/session6/paged_hlo.py local > $S/paged_hlo_local.txt 2>/dev/null
date -u +"%T hlo done" >> $S/run.log
OUT=$R/prefix-share-ttft-cpu-small-s7 bash $R/prefix-share-ttft-cpu-small/run.sh
date -u +"%T ttft done" >> $S/run.log
g4bench revalidate --model small --config ple-bf16/kv-bf16/donated --batch 8,32 --ctx 8192 \
  --kv-layout contiguous,paged --rounds 4 --samples 6 --out $R/revalidate-cpu-small-layouts-bits-s7 > $S/layouts.log 2>&1
date -u +"%T layouts done" >> $S/run.log
