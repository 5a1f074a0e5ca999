"""Writes clinics.csv: a small synthetic tabular data set for simulations/own-csv.toml.

Four clinics, 150 patients each, six numeric measurements and one of three outcomes. The
clinics differ the way real sites do: each sees mostly two of the three outcomes (label skew),
and clinics 2 and 3 measure with an offset (feature shift). Deterministic: run
`python3 examples/own-data/generate.py` to rewrite the same file.
"""
import os
import random

random.seed(2026)
OUTCOMES = ["healthy", "mild", "severe"]
# Each clinic's share of the three outcomes.
MIX = [(0.6, 0.35, 0.05), (0.05, 0.6, 0.35), (0.35, 0.05, 0.6), (0.5, 0.45, 0.05)]
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "clinics.csv"), "w") as f:
    f.write("age,bmi,pressure,glucose,crp,heart_rate,clinic,outcome\n")
    for c, mix in enumerate(MIX):
        offset = 0.8 if c >= 2 else 0.0
        for _ in range(150):
            k = random.choices(range(3), weights=mix)[0]
            centre = [k * 1.5, -k, k * 0.8, k * 1.2, -k * 0.5, k]
            row = [f"{m + random.gauss(0, 1.0) + offset:.3f}" for m in centre]
            f.write(",".join(row) + f",clinic-{c},{OUTCOMES[k]}\n")
