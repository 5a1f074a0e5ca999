#!/usr/bin/env python3
"""Per-silo CSV files in the learning-quality issue's outside setting
(docs/notes/quality-history.md, "Outside the suite as per-silo files"): 10 silos, 5 label groups
of 2 classes, 2 silos a group, one CSV file a silo, the features as the data set has them
(optdigits' pixel counts 0-16, the sensor traces' units around 500).

    python3 docs/ablations/per-silo-files.py OPTDIGITS_DIR SIGNALS_CSV

OPTDIGITS_DIR holds optdigits.tra and optdigits.tes (`federico data download optdigits`
puts them in data/optdigits); SIGNALS_CSV is examples/signals/signals.csv (`python3
examples/signals/generate.py`). Writes docs/ablations/per-silo/{opt100,optall,sig100,sigall}/
site-<i>.csv beside this script: the *100 sets keep 100 rows a silo, the *all sets every row
of the group's two classes, divided between its two silos. Standard library only; the same
files every time (seed 1).
"""
import csv
import os
import random
import sys


def write(folder, header, rows, per_silo, seed=1):
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    by_class = {}
    for row in rows:
        by_class.setdefault(int(row[-1].lstrip("c")), []).append(row)
    for group in range(5):
        pool = [row for c in (2 * group, 2 * group + 1) for row in by_class[c]]
        rng.shuffle(pool)
        for s in range(2):
            part = pool[s::2]
            if per_silo:
                part = part[:per_silo]
            with open(os.path.join(folder, f"site-{2 * group + s}.csv"), "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(header)
                w.writerows(part)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    optdigits, signals = sys.argv[1], sys.argv[2]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "per-silo")
    digits = []
    for name in ("optdigits.tra", "optdigits.tes"):
        with open(os.path.join(optdigits, name)) as f:
            digits += [line.strip().split(",") for line in f if line.strip()]
    header = [f"p{i}" for i in range(64)] + ["digit"]
    write(os.path.join(out, "opt100"), header, digits, 100)
    write(os.path.join(out, "optall"), header, digits, None)
    with open(signals) as f:
        rows = list(csv.reader(f))
    write(os.path.join(out, "sig100"), rows[0], rows[1:], 100)
    write(os.path.join(out, "sigall"), rows[0], rows[1:], None)
    print(f"wrote {out}/{{opt100,optall,sig100,sigall}}/site-0..9.csv")


if __name__ == "__main__":
    main()
