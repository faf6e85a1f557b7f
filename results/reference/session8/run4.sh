#!/usr/bin/env bash
# Session 8: run3.sh's --prefill-chunks 8 half again, on its own port (in run3 its health check
# reached the first half's server while that one shut down, so every serve-load found no server).
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
R=results/reference
S=$R/session8
date -u +"%T run4 start" >> $S/run.log
OUT=$R/prefix-share-ttft-cpu-small-s8-chunks8 PORT=18733 SERVE_ARGS="--prefill-chunks 8" bash $R/prefix-share-ttft-cpu-small/run.sh
date -u +"%T ttft chunks8 done" >> $S/run.log
echo "prefix-share-ttft-cpu-small-s8-chunks8 (run4.sh):" >> $S/ttft.txt
python $R/session7/ttft_ratio.py $R/prefix-share-ttft-cpu-small-s8-chunks8 >> $S/ttft.txt
