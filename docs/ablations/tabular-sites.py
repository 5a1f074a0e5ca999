"""Writes a tabular data set unlike the clinics example, to test `loss_scale = "auto"` out of
sample (docs/notes/quality-history.md, "A temperature from the data"): 8 sites, 10 numeric
features, 4 classes. Sites hold 100-600 rows with their own class mix (Dirichlet(1)) and their own
measurement offsets; sites 0-3 and 4-7 form two groups whose class centres differ (the same
label means different measurements in the two groups). Written once, before any run on it.

    python3 docs/ablations/tabular-sites.py OUT.csv [SEED]
"""
import random
import sys

out = sys.argv[1]
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
D, C, SITES = 10, 4, 8
centres = [[[rng.gauss(0, 1.2) for _ in range(D)] for _ in range(C)] for _ in range(2)]
with open(out, "w") as f:
    f.write(",".join(f"x{d}" for d in range(D)) + ",site,label\n")
    for s in range(SITES):
        group = s // 4
        n = rng.randint(100, 600)
        g = [rng.gammavariate(1.0, 1.0) for _ in range(C)]
        mix = [x / sum(g) for x in g]
        offset = [rng.gauss(0, 0.5) for _ in range(D)]
        for _ in range(n):
            k = rng.choices(range(C), weights=mix)[0]
            row = [centres[group][k][d] + offset[d] + rng.gauss(0, 1.0) for d in range(D)]
            f.write(",".join(f"{v:.3f}" for v in row) + f",site-{s},c{k}\n")
