#!/usr/bin/env bash
# The swarm's round against the in-process round on the same task: one `federico swarm` and one
# `federico simulate` of simulations/fmnist-g4.toml (mstep = "full", 30 rounds, seed 1), and the
# ratio of their median rounds. Run it a few times, alternating binaries when comparing two.
#   tools/swarm-ratio.sh LABEL BINARY OUTDIR     (FEDERICO_DATA_DIR must hold fashion-mnist/)
set -euo pipefail
L=$1; B=$2; D=$3
S="$(cd "$(dirname "$0")/.." && pwd)/simulations/fmnist-g4.toml"
rm -rf "$D/sw-$L" "$D/sim-$L"
sw=$("$B" swarm "$S" --seed 1 --rounds 30 --set federico.mstep='"full"' --set eval_every=100 \
  --out "$D/sw-$L" -q 2>&1 | grep -o "median round [0-9.]* s" | grep -o "[0-9.]*")
"$B" simulate "$S" --seed 1 --rounds 30 --set 'algorithms=["federico"]' --set federico.mstep='"full"' \
  --set eval_every=100 --out "$D/sim-$L" -q > /dev/null 2>&1
sim=$(grep median_round "$D/sim-$L/seed-1/timing.json" | grep -o "[0-9.]*$")
echo "$L swarm $sw sim $sim ratio $(python3 -c "print(round($sw/$sim,3))")"
