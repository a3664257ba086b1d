"""The noise-corrected magnitudes of planted layers over seeds: their mean and spread, with no position and with a
sink at key 0 (docs/method.md §3; measured: §15.1). A layer with no position has estimand 0, so the mean says the
estimator is unbiased and the spread how much information it uses; run it against two versions of posleak (a
checkout first on PYTHONPATH) to compare two estimators on the same layers.

    python scripts/planted_noise.py [--seeds 20] [--num-seqs 16]

prints one line per setting and logit spread σ: the mean ± standard deviation over seeds of each layer value.
"""

from __future__ import annotations

import argparse

import numpy as np

from posleak.measure import Decomposition, Grid, MeasureSpec, measure_layer
from posleak.measure.planted import Planted, planted_layer

NAMES = ("resid_all", "resid_early", "mask_all", "shift_kl_all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--num-seqs", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    for label, sink in (("no position", 0.0), ("sink at key 0 (4 nats)", 4.0)):
        for sigma in (2.0, 3.0, 4.0):
            planted = Planted(sigma=sigma, sink=sink, seq_len=args.seq_len, num_seqs=args.num_seqs)
            spec = MeasureSpec(args.seq_len, args.num_seqs, Grid(args.seq_len), resamples=0, seed=1)
            values: dict[str, list[float]] = {name: [] for name in NAMES}
            for seed in range(args.seeds):
                result = Decomposition.of([measure_layer(planted_layer(planted, seed), spec)], spec)
                for name in NAMES:
                    values[name].append(float(result.layer_means(name)[0]))
            shown = "  ".join(f"{name} {np.mean(v):.4f} ± {np.std(v, ddof=1):.4f}" for name, v in values.items())
            print(f"{label:24s} σ = {sigma:g}  {shown}", flush=True)


if __name__ == "__main__":
    main()
