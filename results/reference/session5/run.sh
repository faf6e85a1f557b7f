#!/usr/bin/env bash
# Session 5 measurements with shared-weights visits (the CPU default), back to back.
# Paths under results/q/s5 are the scratch copies; the committed folders are listed in results/reference/README.md.
set -uo pipefail
cd /work/main
Q=results/q/s5
stamp() { date -u +%H:%M:%S; }
for i in 1 2 3; do
  echo "$(stamp) all-$i"; g4bench revalidate --all --out $Q/all-$i > $Q/all-$i.log 2>&1
done
for i in 1 2 3; do
  echo "$(stamp) donation-$i"
  g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 32 --ctx 8192 --out $Q/donation-$i > $Q/donation-$i.log 2>&1
done
echo "$(stamp) hog run"
( sleep 40; echo "$(stamp) hog starts" >> $Q/hog.times; timeout 60 python -c 'while True: pass'; echo "$(stamp) hog ends" >> $Q/hog.times ) &
g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 32 --ctx 8192 --rounds 4 --out $Q/hog > $Q/hog.log 2>&1
wait
echo "$(stamp) layouts"
g4bench revalidate --model small --config 'ple-bf16/kv-bf16/*' --batch 8,32 --ctx 8192 --kv-layout contiguous,paged --out $Q/layouts > $Q/layouts.log 2>&1
echo "$(stamp) A/A"
g4bench revalidate --aa 40 --model small --config ple-bf16/kv-bf16/donated --batch 8 --ctx 1024 --out $Q/aa > $Q/aa.log 2>&1
echo "$(stamp) done"
