#!/usr/bin/env bash
# Session 6, after the v6e layouts capacity run: paged vs contiguous (donated) at b8/b32 ctx8192 in
# separate and in shared-weights visits, donation at a KV-dominated shape x3, and the hog run; CPU
# defaults unless a flag says otherwise.
set -uo pipefail
cd /work/main
Q=results/q/s6
stamp() { date -u +%H:%M:%S; }
while pgrep -f "g4bench capacity" > /dev/null; do sleep 10; done
for visit in separate shared-weights; do
  echo "$(stamp) layouts-$visit"
  g4bench revalidate --model small --config 'ple-bf16/kv-bf16/donated' --batch 8,32 --ctx 8192 --kv-layout contiguous,paged \
    --rounds 6 --samples 8 --visit $visit --out $Q/layouts-$visit > $Q/layouts-$visit.log 2>&1
done
for i in 1 2 3; do
  echo "$(stamp) donation-$i"
  g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 32 --ctx 8192 --out $Q/donation-$i > $Q/donation-$i.log 2>&1
done
echo "$(stamp) hog run"
( sleep 40; echo "$(stamp) hog starts" >> $Q/hog.times; timeout 60 python -c 'while True: pass'; echo "$(stamp) hog ends" >> $Q/hog.times ) &
g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 32 --ctx 8192 --rounds 4 --out $Q/hog > $Q/hog.log 2>&1
wait
echo "$(stamp) done"
