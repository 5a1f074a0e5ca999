#!/usr/bin/env python3
"""Writes signals.csv: 3,000 synthetic sensor traces of 40 samples each, 10 classes, in the
sensor's own units. Python 3, standard library only; the same file every time (seed 7).

Each class is a template of three Gaussian bumps (centre, width and sign drawn once). A trace
is its class's template shifted by up to two samples, scaled by 0.7-1.3, plus white noise of
standard deviation NOISE (default 1.5: a silo training alone on two classes reaches about 75 %),
then reported as a sensor would: 500 + 80 * value.

    python3 examples/signals/generate.py [NOISE] [OUT]
"""
import math
import random
import sys

noise = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
out_path = sys.argv[2] if len(sys.argv) > 2 else __file__.rsplit("/", 1)[0] + "/signals.csv"
rng = random.Random(7)
templates = []
for _ in range(10):
    bumps = [(rng.uniform(5, 35), rng.uniform(2, 6), rng.uniform(-1, 1)) for _ in range(3)]
    templates.append(
        [sum(a * math.exp(-(((t - m) / w) ** 2) / 2) for m, w, a in bumps) for t in range(40)]
    )
with open(out_path, "w") as out:
    out.write(",".join(f"s{t}" for t in range(40)) + ",label\n")
    for i in range(3000):
        c = i % 10
        shift = rng.randint(-2, 2)
        amp = rng.uniform(0.7, 1.3)
        x = [amp * templates[c][min(39, max(0, t + shift))] + rng.gauss(0, noise) for t in range(40)]
        out.write(",".join(f"{500 + 80 * v:.4f}" for v in x) + f",c{c}\n")
