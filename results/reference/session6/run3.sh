#!/usr/bin/env bash
# Session 6, once the steal fell to ~0-1% (07:01): revalidate --all x3 with the CPU defaults, back to back.
set -uo pipefail
cd /work/main
Q=results/q/s6
stamp() { date -u +%H:%M:%S; }
for i in 1 2 3; do
  echo "$(stamp) quiet-all-$i"; g4bench revalidate --all --out $Q/quiet-all-$i > $Q/quiet-all-$i.log 2>&1
done
echo "$(stamp) done"
