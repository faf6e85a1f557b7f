#!/usr/bin/env bash
# After revalidate --all: A/A on small, then a short run with a CPU hog started mid-run.
set -uo pipefail
cd /work/main
Q=results/q
stamp() { date -u +%H:%M:%S; }
while pgrep -f "revalidate --all --out results/q/all-1" >/dev/null; do sleep 5; done
echo "$(stamp) A/A"; g4bench revalidate --aa 40 --model small --config ple-bf16/kv-bf16/donated --batch 8 --ctx 1024 --samples 4 --out $Q/aa-small > $Q/aa-small.log 2>&1
echo "$(stamp) hog run"
( sleep 45; echo "$(stamp) hog starts" >> $Q/hog.times; timeout 60 python -c 'while True: pass'; echo "$(stamp) hog ends" >> $Q/hog.times ) &
g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 32 --ctx 8192 --rounds 4 --out $Q/hog > $Q/hog.log 2>&1
wait
echo "$(stamp) done"
