#!/usr/bin/env bash
# The attack table of docs/insiders.md: every poisoning kind, played by 1 of 8 and by 2 of 8
# members from round 5, on a scenario (default: the quick synthetic one), with the norm bound as
# the scenario has it. Each row is one `federico simulate` run of the scenario with its own
# fault-free run beside it; the figures are its poisoning check's, averaged over the seeds.
#
#   simulations/attacks/table.sh [SCENARIO] [OUT] [--set ...]
#   simulations/attacks/table.sh simulations/poisoning.toml runs/attacks
#   simulations/attacks/table.sh simulations/poisoning.toml runs/attacks-off --set defences.norm_bound=0
#
# Coordinator algorithms: name one (`--set 'algorithms=["hcct"]'`); a run of several averages
# them into one row. Their attackers poison the model they send (its update); the weight is the
# coordinator's on them in its last round (FedDisco: of the global; FedSaC: in honest silos'
# graph rows; HCCT: of the members of honest silos' groups).
#
# Needs `federico` on PATH or FEDERICO=path/to/federico. ATTACKS, one kind per line (as below),
# runs only those. A row whose run is already in OUT is not run again.
set -euo pipefail
scenario=${1:-simulations/poisoning.toml}
out=${2:-runs/attacks}
shift $(( $# < 2 ? $# : 2 ))
fed=${FEDERICO:-federico}
mkdir -p "$out"
kinds=(
  'kind="scale", factor=1e6'
  'kind="scale", factor=10'
  'kind="sign_flip"'
  'kind="sign_flip", factor=10'
  'kind="noise", factor=10'
  'kind="extreme"'
  'kind="stale"'
  'kind="free_ride"'
  'kind="labels"'
)
if [ -n "${ATTACKS:-}" ]; then
  mapfile -t kinds <<< "$ATTACKS"
fi
echo "| attack | attackers | honest silos, attacked | same run, no attack | lost (points) | attackers' weight in honest rows (mean / max) | check |"
echo "|---|---|---|---|---|---|---|"
for kind in "${kinds[@]}"; do
  for silos in "[3]" "[3, 7]"; do
    tag=$(echo "$kind $silos" | tr -c 'a-z0-9' '-' | tr -s '-')
    dir="$out/$tag"
    if [ ! -f "$dir/summary.json" ]; then
      rm -rf "$dir"
      "$fed" simulate "$scenario" --out "$dir" \
        --set "faults.events=[{round=5, attack={silos=$silos, $kind}}]" "$@" > "$dir.log" 2>&1 \
        || { echo "| $kind | $silos | failed: see $dir.log |"; continue; }
    fi
    # One "PASS poisoning ..." / "FAIL poisoning ..." line per seed.
    grep -E '^(PASS|FAIL) poisoning' "$dir.log" | awk -v kind="$kind" -v silos="$silos" '
      { n++
        for (i = 1; i <= NF; i++) {
          if ($i == "silos" && $(i+2) == "%") a += $(i+1)
          if ($i == "vs") b += $(i+1)
          if ($i == "average") { m += substr($(i+3), 1) ; }
          if ($i == "most") { x = $(i+1); sub(/\).*/, "", x); if (x + 0 > mx) mx = x + 0 }
          if ($i == "hold") { w += $(i+1); held++ }
        }
        if ($1 == "PASS") pass++ }
      END { weight = held ? sprintf("%.3f / %.3f", w / n, mx) : "not measured"
            printf "| %s | %s | %.2f | %.2f | %.2f | %s | %d of %d seeds pass |\n",
            kind, silos, a / n, b / n, (b - a) / n, weight, pass, n }'
  done
done
