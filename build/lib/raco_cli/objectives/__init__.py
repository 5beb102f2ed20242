"""Training objectives (``objective=<name>``): empirical risk (ERM) or psi-divergence DRO.

``erm`` is what every method minimised before (mean loss, plus a method's own penalty).
``dro`` is the distributionally robust objective of the DP-DRO paper (eq. 2)::

    F(x) = max_{p in simplex} sum_i p_i l_i(x) - lambda D_psi(p, 1/n)

for ``objective.divergence`` in chi2, cvar (KL-regularised CVaR), cressie_read (order k) with a
fixed ``objective.lambda``; and, for ``kl``, the KL-*constrained* problem (radius rho) in its
compositional form (eq. 5)::

    F(x) = min_{lambda >= lambda0} lambda log((1/n) sum_i exp(l_i(x) / lambda)) + lambda rho

where ``objective.lambda`` is the initial lambda.  The maths lives in
:mod:`raco_cli.objectives.divergences` and :mod:`raco_cli.objectives.dro`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raco_cli.errors import CHOICE, ConfigError

OBJECTIVES = ("erm", "dro")
DIVERGENCES = ("chi2", "cvar", "cressie_read", "kl")


@dataclass(frozen=True)
class ObjectiveSpec:
    """The ``objective`` config group, validated.

    Attributes:
        name: ``erm`` or ``dro``.
        divergence: chi2 | cvar | cressie_read | kl (``dro`` only).
        lam: ``objective.lambda``: the penalty weight lambda of eq. 2/3 (kl: the initial
            lambda of eq. 5, a variable >= lambda0).
        rho: radius of the KL ball (kl only).
        lambda0: lower bound of lambda (kl only).
        k: Cressie-Read order, > 1.
        alpha: CVaR level in (0, 1): worst-case weights are capped at 1/alpha.
    """

    name: str = "erm"
    divergence: str = "kl"
    lam: float = 1.0
    rho: float = 0.5
    lambda0: float = 1e-3
    k: float = 2.0
    alpha: float = 0.1

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ConfigError(CHOICE.format(key="objective.name", choices=", ".join(OBJECTIVES), value=self.name,
                                            meaning="erm: mean loss; dro: the psi-divergence DRO objective (docs/dro.md)."))
        if self.divergence not in DIVERGENCES:
            raise ConfigError(CHOICE.format(key="objective.divergence", choices=", ".join(DIVERGENCES), value=self.divergence,
                                            meaning="the psi-divergence of the uncertainty set (paper Table 1)."))
        for key, value, meaning in (
            ("objective.lambda", self.lam, "the weight lambda of the divergence penalty (kl: the initial lambda)."),
            ("objective.rho", self.rho, "the radius of the KL uncertainty set."),
            ("objective.lambda0", self.lambda0, "the lower bound of lambda in eq. 5."),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{key} must be a finite number > 0 (got {key}={value!r}); {meaning}")
        if not (isinstance(self.k, (int, float)) and not isinstance(self.k, bool) and math.isfinite(self.k) and self.k > 1):
            raise ConfigError(f"objective.k must be a finite number > 1 (got objective.k={self.k!r}); the Cressie-Read order.")
        if not (isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool) and 0 < self.alpha < 1):
            raise ConfigError(f"objective.alpha must be in (0, 1) (got objective.alpha={self.alpha!r}); the CVaR level "
                              "(worst-case weights are capped at 1/alpha).")
        if self.divergence == "kl" and self.lam < self.lambda0:
            raise ConfigError(f"objective.lambda must be >= objective.lambda0 for divergence=kl (got objective.lambda={self.lam}, "
                              f"objective.lambda0={self.lambda0}); it is the initial lambda of eq. 5.")

    @property
    def is_dro(self) -> bool:
        return self.name == "dro"

    @property
    def compositional(self) -> bool:
        """KL-constrained DRO (eq. 5): lambda is a variable >= lambda0 and rho is the radius."""
        return self.divergence == "kl"


def objective_spec(cfg: dict | None) -> ObjectiveSpec:
    """``objective`` config (a mapping; None: ERM) -> :class:`ObjectiveSpec`.

    Raises:
        ConfigError: an unknown key or a bad value (one line).
    """
    cfg = dict(cfg or {})
    allowed = ("name", "divergence", "lambda", "rho", "lambda0", "k", "alpha")
    for key in cfg:
        if key not in allowed:
            raise ConfigError(f"Unknown key objective.{key}. Allowed: {', '.join('objective.' + a for a in allowed)}.")
    kwargs = {("lam" if key == "lambda" else key): value for key, value in cfg.items()}
    for key in ("lam", "rho", "lambda0", "k", "alpha"):
        if isinstance(kwargs.get(key), int) and not isinstance(kwargs.get(key), bool):
            kwargs[key] = float(kwargs[key])
    return ObjectiveSpec(**kwargs)
