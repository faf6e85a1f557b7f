#!/usr/bin/env bash
# After run.sh: the same ple-bf16 half of the grid in both visit modes, back to back (design cross-check).
# Paths under results/q/s5 are the scratch copies; the committed folders are listed in results/reference/README.md.
set -uo pipefail
cd /work/main
Q=results/q/s5
stamp() { date -u +%H:%M:%S; }
while pgrep -f "results/q/s5/run.sh" >/dev/null; do sleep 5; done
echo "$(stamp) separate"
g4bench revalidate --config 'ple-bf16/*' --visit separate --out $Q/bf16-separate > $Q/bf16-separate.log 2>&1
echo "$(stamp) shared"
g4bench revalidate --config 'ple-bf16/*' --visit shared-weights --out $Q/bf16-shared > $Q/bf16-shared.log 2>&1
echo "$(stamp) done"
