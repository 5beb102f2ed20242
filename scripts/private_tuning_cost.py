"""The price of a private search: the per-trial eps each repetition distribution leaves inside one
total eps (planning only: no trial is trained, nothing is written).

    python scripts/private_tuning_cost.py dataset=adult constraint=dp eps=1
    python scripts/private_tuning_cost.py --score-noise 10,30,60 dataset=adult constraint=dp eps=1

prints, per distribution, the per-trial eps ``raco tune`` would plan and the search's eps; with
``--score-noise``, the same for the default distribution at each score noise (rows), and the
validation accuracy's noise sd that score noise gives.
"""

from __future__ import annotations

import sys

from raco_cli.privacy.tuning import Repetitions
from raco_cli.run.private_search import PrivateSearch, SearchOptions

SETTINGS = [
    Repetitions("fixed", 1),
    Repetitions("truncated_negative_binomial", 3.0, 1.0),
    Repetitions("truncated_negative_binomial", 10.0, 1.0),
    Repetitions("truncated_negative_binomial", 10.0, 0.0),
    Repetitions("poisson", 10.0),
    Repetitions("fixed", 10),
]


def score_noise_scan(noises: list[float], overrides: list[str]) -> int:
    print(f"{'score noise (rows)':<20} {'per-trial eps':>13} {'search eps':>10} {'val accuracy sd':>15}")
    for s in noises:
        opts = SearchOptions(repetitions=Repetitions("poisson", 10.0), candidates=8, score_noise=s, sampler_seed=0, study=None)
        search = PrivateSearch(opts, [*overrides, "tracking=none"])
        n_val = len(search._prepare([], search.eps_trial).data.splits["val"])  # planning only: exact, printed for the reader
        print(f"{s:<20g} {search.eps_trial:>13.4f} {search.eps_spent:>10.4f} {s / n_val:>15.4f}", flush=True)
    return 0


def main(overrides: list[str]) -> int:
    if overrides[:1] == ["--score-noise"]:
        return score_noise_scan([float(v) for v in overrides[1].split(",")], overrides[2:])
    print(f"{'repetitions':<48} {'per-trial eps':>13} {'search eps':>10}")
    for reps in SETTINGS:
        opts = SearchOptions(repetitions=reps, candidates=8, score_noise=30.0, sampler_seed=0, study=None)
        search = PrivateSearch(opts, [*overrides, "tracking=none"])
        print(f"{reps.describe():<48} {search.eps_trial:>13.4f} {search.eps_spent:>10.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
