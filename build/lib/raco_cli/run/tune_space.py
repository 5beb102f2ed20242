"""The search space of ``raco tune`` (the paper's ranges, App. E.2) and Optuna values -> overrides.

In the run layer because both searches read it: the paper's Optuna search on the command line,
and the private search (:mod:`raco_cli.run.private_search`), which may not import the command line.

Search space (RaCO-DP; other methods use the subset they have):

==========================  ====================  =========================================
key                         range                 paper (App. E.2)
==========================  ====================  =========================================
method.noise_multiplier     [3, 6]                sigma in [3, 6]
method.hist_noise_multiplier 1/b, b in [0.1, 0.5]  Laplace b in [0.1, 0.5]  (ours = 1/b)
method.lr                   [0.01, 10] log        eta_theta in [1e-4, 0.1]
method.lr_dual              [0.01, 10] log        eta_lambda in [1e-4, 0.1]
method.batch_size           [256, 1256]           B in [256, 1256]
method.temperature          [1, 10]               tau in [1, 10]
method.options.lam          [0.1, 32] log         DP-FERMI only: the ERMI weight lambda
==========================  ====================  =========================================

DP-FERMI cannot take gamma: its fairness knob is lambda, so its search includes lambda (and
lr_dual, its W step) and gamma only decides feasibility, as for the other methods.

Learning rates: our update divides the noisy clipped gradient sum by q|D| (a mean over the
expected batch) and the dual gradient is a rate difference of order 0.1, so steps in the
paper's [1e-4, 0.1] barely move the model within the few hundred steps eps allows (Adult, DP,
eps=1, gamma=0.05: test accuracy 0.812 at lr = lr_dual = 0.1 vs 0.832 at lr=3, lr_dual=0.5,
one seed; the shipped defaults are lr=4, lr_dual=1).  We therefore search [0.01, 10] on a log scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    key: str  # config key (override)
    low: float
    high: float
    log: bool = False
    integer: bool = False
    inverse: bool = False  # sample 1/value (the paper's Laplace b) and set 1/b


SPACE = {
    "noise_multiplier": Param("method.noise_multiplier", 3.0, 6.0),
    "laplace_b": Param("method.hist_noise_multiplier", 0.1, 0.5, inverse=True),
    "lr": Param("method.lr", 0.01, 10.0, log=True),
    "lr_dual": Param("method.lr_dual", 0.01, 10.0, log=True),
    "batch_size": Param("method.batch_size", 256, 1256, integer=True),
    "temperature": Param("method.temperature", 1.0, 10.0),
    "lam": Param("method.options.lam", 0.1, 32.0, log=True),
    # DRO methods (docs/dro.md "Equal tuning"): the dual block's step, T (the noise is calibrated to
    # eps at each T), the SPIDER phase q, the refresh clip and the corrections' adaptive clip scale
    "lr_dual_dro": Param("method.lr_dual", 1e-3, 1.0, log=True),
    "steps": Param("method.steps", 200, 2000, log=True, integer=True),
    "phase": Param("method.options.phase", 2, 200, log=True, integer=True),  # Theorem 7: q 2-10 on the digits MLP, 45-207 on Adult
    "clip_norm": Param("method.clip_norm", 0.1, 10.0, log=True),
    "diff_clip_scale": Param("method.options.diff_clip_scale", 0.25, 8.0, log=True),
}
METHOD_SPACE = {
    "raco_dp": ("noise_multiplier", "laplace_b", "lr", "lr_dual", "batch_size", "temperature"),
    "dp_sgd": ("noise_multiplier", "lr", "batch_size"),
    "sgda": ("lr", "lr_dual", "batch_size", "temperature"),
    "sgd": ("lr", "batch_size"),
    "dp_fermi": ("noise_multiplier", "lr", "lr_dual", "batch_size", "lam"),
}
# objective=dro: every DRO method searches the same keys it has (equal tuning: the same trials each)
DRO_SPACE = {
    "dp_sgda": ("lr", "lr_dual_dro", "steps", "clip_norm"),
    "dp_private_diff": ("lr", "lr_dual_dro", "steps", "clip_norm"),
    "dp_double_spider": ("lr", "lr_dual_dro", "steps", "phase", "clip_norm", "diff_clip_scale"),
    "dp_recursive_spider": ("lr", "lr_dual_dro", "steps", "phase", "clip_norm", "diff_clip_scale"),
    "sgda": ("lr", "lr_dual_dro", "steps"),
    "spider": ("lr", "lr_dual_dro", "steps", "phase"),
}
DEFAULT_SPACE = ("noise_multiplier", "lr", "batch_size")


def space_of(method: str, objective: str = "erm") -> tuple[str, ...]:
    """The names a method searches (``objective=dro``: :data:`DRO_SPACE`).

    >>> space_of("sgda"), space_of("sgda", "dro")
    (('lr', 'lr_dual', 'batch_size', 'temperature'), ('lr', 'lr_dual_dro', 'steps'))
    """
    if objective == "dro":
        return DRO_SPACE.get(method, ("lr", "lr_dual_dro", "steps"))
    return METHOD_SPACE.get(method, DEFAULT_SPACE)


def default_study(method: str, dataset: str, constraint: str, eps: float, gamma: float) -> str:
    """The default name of a search (its output folder; MLflow experiment ``tune-<name>``).

    >>> default_study("raco_dp", "adult", "dp", 1, 0.05)
    'raco_dp-adult-dp-eps1-gamma0.05'
    """
    return f"{method}-{dataset}-{constraint}-eps{float(eps):g}-gamma{float(gamma):g}"


def trial_overrides(values: Mapping[str, float], method: str) -> list[str]:
    """Optuna's sampled values -> config overrides.

    >>> trial_overrides({"laplace_b": 0.25, "lr": 0.5}, "raco_dp")
    ['method.hist_noise_multiplier=4.0', 'method.lr=0.5']
    """
    out = []
    for name, value in values.items():
        p = SPACE[name]
        v = 1.0 / value if p.inverse else value
        out.append(f"{p.key}={int(v) if p.integer else float(v)!r}")
    return out


# The private search's space (``raco tune`` under privacy.scope=model, :mod:`raco_cli.run.private_search`):
# log-uniform factors around the configuration as given, as resolved for the data (its auto batch
# size from the released n~; an auto dual step is not scaled but stays auto).  Not the paper's
# absolute ranges: a private search cannot afford candidates that cannot learn, and its noisy score
# barely tells apart those that can.  Measured on Parkinsons (~3 700 training rows) at a per-trial
# eps of 0.33: the paper's batch sizes 256-1 256 leave 2-15 noisy steps a trial, and one search in
# ten released a 2-step model (test accuracy 0.61; docs/privacy.md "Tuning inside eps").
LOCAL_RANGE = {  # name -> (low, high): the factor is log-uniform in [low, high]
    "noise_multiplier": (1 / 1.5, 1.5),  # sigma trades steps for noise inside eps: 3 -> [2, 4.5]
    "laplace_b": (0.5, 2.0),  # the histogram's Laplace scale
    "lr": (0.25, 4.0),
    "lr_dual": (0.25, 4.0),
    # n~/16 (auto) -> [n~/64, n~/8], within [MIN_BATCH, n~/2]: a trial's eps is a fraction of the
    # run's, and at a smaller eps smaller batches keep more steps (the search leaves out a candidate
    # planned for fewer than FEW_STEPS; Parkinsons at per-trial eps 0.38: batch 256 -> 16 steps);
    # much smaller ones make the histograms' noise swamp the dual (Adult, batch 146-186: test DP gap
    # 0.07-0.09 against gamma 0.05)
    "batch_size": (0.25, 2.0),
    "temperature": (0.5, 2.0),
    "lam": (0.25, 4.0),
    "lr_dual_dro": (0.25, 4.0),
    "steps": (0.5, 2.0),
    "phase": (0.5, 2.0),
    "clip_norm": (0.5, 2.0),
    "diff_clip_scale": (0.5, 2.0),
}
MIN_BATCH = 8


def local_overrides(values: Mapping[str, Any], factors: Mapping[str, float], n_train: float) -> list[str]:
    """Config overrides of one local candidate: each given value times its drawn factor.

    ``values`` are the configuration's resolved values (``laplace_b`` as the histogram's noise
    multiplier, ``method.hist_noise_multiplier``); ``n_train`` bounds the batch size.

    >>> local_overrides({"lr": 4.0, "batch_size": 256}, {"lr": 0.5, "batch_size": 4.0}, n_train=600)
    ['method.lr=2.0', 'method.batch_size=300']
    """
    out = []
    for name, factor in factors.items():
        p = SPACE[name]
        v = float(f"{float(values[name]) * float(factor):.4g}")  # 4 digits: readable in best.yaml
        if name == "batch_size":
            v = int(min(max(round(v), MIN_BATCH), max(MIN_BATCH, n_train // 2)))
        elif p.integer:
            v = max(1, round(v))
        out.append(f"{p.key}={int(v) if p.integer else float(v)!r}")
    return out
