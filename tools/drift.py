#!/usr/bin/env python3
"""Where FedeRiCo's weight and gradients go, round by round (docs/notes/quality-history.md, "Why").

Reads a simulate run folder (its seed-*/rounds.jsonl and seed-*/partition.json) and prints,
averaged over seeds, at a few rounds: FedeRiCo's pooled accuracy (evaluated rounds only),
its same-group weight mass, and the share of the gradient weight (w_ij * n_i, as a FedeRiCo
gradient is scaled) that silos send into models owned by another group. A gradient below
the push cut (--push-cut, the run's federico.push_cut) is not sent and counts as nothing.

    python3 tools/drift.py runs/quality/fmnist-g4-n150 --push-cut 0.5
"""
import argparse
import glob
import json
import os

ap = argparse.ArgumentParser()
ap.add_argument("run", help="a simulate output folder")
ap.add_argument("--push-cut", type=float, default=0.0)
ap.add_argument("--rounds", default="1,5,10,20,30,50,75,100")
args = ap.parse_args()
show = [int(r) for r in args.rounds.split(",")]

rows = {}  # round -> list of (acc or None, mass, cross share)
for seed_dir in sorted(glob.glob(os.path.join(args.run, "seed-*"))):
    part = json.load(open(os.path.join(seed_dir, "partition.json")))
    group = [c["group"] for c in part["clients"]]
    n = [c["train"] for c in part["clients"]]
    if any(g is None for g in group):
        raise SystemExit(f"{seed_dir}: the split has no groups")
    for line in open(os.path.join(seed_dir, "rounds.jsonl")):
        rec = json.loads(line)
        fed = rec.get("federico")
        if fed is None:
            continue
        w, sampled = fed["weights"], fed["sampled"]
        k = len(w)
        mass = sum(w[i][j] for i in range(k) for j in range(k) if group[j] == group[i]) / k
        cross = total = 0.0
        for i in range(k):
            top = max(w[i])
            for j in [i] + sampled[i]:
                if j != i and w[i][j] < args.push_cut * top:
                    continue
                flow = w[i][j] * n[i]
                total += flow
                if group[j] != group[i]:
                    cross += flow
        acc = next((a["accuracy"] for a in rec["algorithms"] if a["algorithm"] == "federico"), None)
        rows.setdefault(rec["round"], []).append((acc, mass, cross / total if total else 0.0))

print("| round | FedeRiCo accuracy % | same-group mass | gradient weight into other groups' models |")
print("|---|---|---|---|")
for r in show:
    if r not in rows:
        continue
    vals = rows[r]
    accs = [a for a, _, _ in vals if a is not None]
    acc = f"{100 * sum(accs) / len(accs):.2f}" if accs else "–"
    mass = sum(m for _, m, _ in vals) / len(vals)
    cross = sum(c for _, _, c in vals) / len(vals)
    print(f"| {r} | {acc} | {mass:.2f} | {cross:.3f} |")
