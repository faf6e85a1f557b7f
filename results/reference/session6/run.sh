#!/usr/bin/env bash
# Session 6 measurements with the CPU defaults (separate visits, 3 rounds x 5 samples), back to back.
# Paths under results/q/s6 are the scratch copies; the committed folders are listed in results/reference/README.md.
set -uo pipefail
cd /work/main
Q=results/q/s6
stamp() { date -u +%H:%M:%S; }
for i in 1 2 3; do
  echo "$(stamp) all-$i"; g4bench revalidate --all --out $Q/all-$i > $Q/all-$i.log 2>&1
done
echo "$(stamp) done"
