#!/usr/bin/env bash
# Session 8, third batch: issue 14's TTFT must-show with the server default (one prefill chunk per
# turn) and with --prefill-chunks 8 (a wave of 8 agent turns prefilled before the next decode).
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
R=results/reference
S=$R/session8
date -u +"%T run3 start" >> $S/run.log
OUT=$R/prefix-share-ttft-cpu-small-s8 bash $R/prefix-share-ttft-cpu-small/run.sh
date -u +"%T ttft default done" >> $S/run.log
OUT=$R/prefix-share-ttft-cpu-small-s8-chunks8 SERVE_ARGS="--prefill-chunks 8" bash $R/prefix-share-ttft-cpu-small/run.sh
date -u +"%T ttft chunks8 done" >> $S/run.log
for d in prefix-share-ttft-cpu-small-s8 prefix-share-ttft-cpu-small-s8-chunks8; do
  echo "$d:" >> $S/ttft.txt; python $R/session7/ttft_ratio.py $R/$d >> $S/ttft.txt
done
