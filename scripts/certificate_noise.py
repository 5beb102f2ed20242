"""How often the certificate of ``constraint.confidence`` holds, per certificate noise multiplier
(docs/methods.md "The claim is a certificate of the released model").

Trains ``--seeds`` runs of a command in this process, captures each released model's *exact*
validation counts at the certificate's release (a spy on ``raco_cli.privacy.certificate.noisy_counts``:
a measurement, never a record), then re-draws the certificate ``--draws`` times per model at each
``--sigmas`` (post-processing of the counts: no retraining) and prints P(certificate holds) per
seed and on average, with each run's test constraint.

    RACO_DATA_MIRROR=../shared/datasets python scripts/certificate_noise.py --seeds 10 dataset=adult constraint=dp eps=1
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[5.0, 10.0, 20.0, 50.0])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import torch

    import raco_cli.privacy.certificate as release
    from raco_cli import api
    from raco_cli.constraints.certificate import certify
    from raco_cli.privacy.discrete import discrete_gaussian, discrete_gaussian_for
    from raco_cli.run import certify as run_certify

    captured: list[tuple[np.ndarray, object, float, int]] = []
    real_noisy, real_certify = release.noisy_counts, run_certify.certify

    def spy_certify(cons, counts, **kw):  # the constraints and N of the run's certificate
        captured[-1] = (*captured[-1][:1], cons, kw["confidence"], kw["candidates"])
        return real_certify(cons, counts, **kw)

    def spy_noisy(counts, **kw):
        captured.append((np.asarray(counts).copy(), None, 0.0, 1))
        return real_noisy(counts, **kw)

    release.noisy_counts, run_certify.certify = spy_noisy, spy_certify
    runs = []
    for seed in range(args.seeds):
        summary = api.train([*args.overrides, f"seed={seed}", "tracking=none"]).summary
        test = summary["metrics"]["test"]
        runs.append((captured[-1], test["accuracy"], test["constraint_max_hard"], summary["gamma"]))
        print(f"seed {seed}: test accuracy {test['accuracy']:.4f}, test max Gamma {test['constraint_max_hard']:.4f}, "
              f"printed confidence {summary['confidence']}", flush=True)
    generator = torch.Generator().manual_seed(0)
    for sigma in args.sigmas:
        sd = discrete_gaussian_for(sigma)
        rates = []
        for (counts, cons, confidence, candidates), *_ in runs:
            noise = discrete_gaussian((args.draws * counts.size,), sd, generator).numpy().reshape(args.draws, *counts.shape)
            holds = [certify(cons, counts + z, confidence=confidence, count_sd=float(sd), candidates=candidates).holds
                     for z in noise]
            rates.append(float(np.mean(holds)))
        print(f"sigma {sigma:g} (sigma_Z {sd}): P(certificate holds) per seed {[round(r, 2) for r in rates]}, "
              f"mean {np.mean(rates):.3f}")


if __name__ == "__main__":
    main()
