#!/usr/bin/env bash
# Byte comparison of two output folders of the same `federico simulate` runs: every
# summary.json, rounds.jsonl, partition.json and fedcollab.json under A against B.
#   tools/compare-runs.sh A B
A=$1; B=$2; same=0; diff=0
for f in $(cd "$A" && find . -name summary.json -o -name rounds.jsonl -o -name partition.json -o -name fedcollab.json | sort); do
  if cmp -s "$A/$f" "$B/$f"; then same=$((same+1)); else diff=$((diff+1)); echo "DIFFERS: $f"; fi
done
echo "$same identical, $diff different"
