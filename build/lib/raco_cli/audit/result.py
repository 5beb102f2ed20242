"""What both one-run audits (:mod:`~raco_cli.audit.one_run`: the histogram,
:mod:`~raco_cli.audit.gradient`: the gradient sum) share: the settings (:class:`AuditSpec`), the
guessing tests that turn canary scores into an eps lower bound (:func:`one_run_tests`) and the
result (:class:`AuditResult`, :func:`build_result`).

A module of its own so that the gradient audit needs nothing from the histogram audit, which
dispatches to it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from raco_cli.audit import stats
from raco_cli.audit.faults import GRADIENT_MECHANISMS, HISTOGRAM_MECHANISMS
from raco_cli.errors import ConfigError

TARGETS = {"histogram": HISTOGRAM_MECHANISMS, "gradient": GRADIENT_MECHANISMS}


@dataclass(frozen=True)
class AuditSpec:
    """Settings of a one-run audit (``audit.*`` keys of ``raco audit``).

    Attributes:
        canaries: m, the number of canaries (about half are included).
        beta: 1 - confidence of the lower bound.
        label: label of every canary.
        seed: seed of the inclusion signs S, the canary rows and the tie-breaking
            (independent of the run's training seeds).
        mechanism: ``correct``, or a deliberately broken release of the target (test cases).
        scale: factor applied to the canaries' features.
        target: the release audited: ``histogram`` (RaCO-DP's Laplace histogram) or
            ``gradient`` (the Gaussian gradient sum of raco_dp / dp_sgd, Dirac canaries).
    """

    canaries: int = 2000
    beta: float = 0.05
    label: int = 1
    seed: int = 0
    mechanism: str = "correct"
    scale: float = 1.0
    target: str = "histogram"

    def __post_init__(self) -> None:
        if isinstance(self.canaries, bool) or not isinstance(self.canaries, int) or self.canaries < 10:
            raise ConfigError(f"audit.canaries must be an integer >= 10 (got audit.canaries={self.canaries!r}); it is the number of canary records m.")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not 0 < self.beta < 1:
            raise ConfigError(f"audit.beta must be in (0, 1) (got audit.beta={self.beta!r}); the bound holds with confidence 1 - beta.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"audit.seed must be a non-negative integer (got audit.seed={self.seed!r}); it seeds the canaries' inclusion.")
        if isinstance(self.label, bool) or not isinstance(self.label, int) or self.label < 0:
            raise ConfigError(f"audit.label must be a non-negative integer (got audit.label={self.label!r}); it is the canaries' label.")
        if self.target not in TARGETS:
            raise ConfigError(f"audit.target must be one of {', '.join(TARGETS)} (got audit.target={self.target!r}); it is the release audited.")
        allowed = TARGETS[self.target]
        if self.mechanism not in allowed:
            raise ConfigError(f"audit.mechanism must be one of {', '.join(allowed)} with audit.target={self.target} "
                              f"(got audit.mechanism={self.mechanism!r}); broken_* are the audit's own test cases.")
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not (self.scale > 0 and math.isfinite(self.scale)):
            raise ConfigError(f"audit.scale must be > 0 (got audit.scale={self.scale!r}); it multiplies the canaries' features.")


@dataclass
class AuditResult:
    """What ``raco audit`` reports (also written to ``audit.json``)."""

    eps_lower_bound: float
    confidence: float
    eps_accounted: float
    eps_accounted_histogram: float | None
    eps_target: float
    delta: float
    violation: bool
    mechanism: str
    canaries: int
    included: int
    steps: int
    sample_rate: float
    hist_noise_multiplier: float | None
    best: dict[str, Any]
    tests: list[dict[str, Any]]
    conformance: dict[str, Any]
    seeds: dict[str, Any]
    event: str
    settings: dict[str, Any] = field(default_factory=dict)
    target: str = "histogram"
    eps_accounted_released: float | None = None  # eps of the audited releases alone

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def one_run_tests(scores: dict[str, np.ndarray], included: np.ndarray, *, q: float, steps: int, delta: float, beta: float,
                  rng: np.random.Generator) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The one-run tests of every score: +1 guesses for the k highest, for 3 values of k fixed in
    advance from the expected number of included-and-sampled canaries, each bound at the
    Bonferroni level ``beta / (scores x ks)``.

    Returns:
        ``(tests, best)``: every test (score, k, correct, eps_lower_bound) and the largest.
    """
    m = len(included)
    k_max = max(1, math.floor((m / 2) * (1 - math.exp(-q * steps)) - 1.5 * math.sqrt(m)))
    ks = sorted({max(1, k_max), max(1, k_max // 2), max(1, k_max // 4)}, reverse=True)
    level = beta / (len(scores) * len(ks))
    tests: list[dict[str, Any]] = []
    for name, score in scores.items():
        for k in ks:
            guess = stats.top_k_guesses(score, k, rng)
            v = int(included[guess].sum())
            lb = stats.eps_lower_bound_one_run(m, k, v, delta=delta, beta=level)
            tests.append({"score": name, "k": int(k), "correct": v, "eps_lower_bound": float(lb)})
    return tests, max(tests, key=lambda t: t["eps_lower_bound"])


def build_result(prep, audit: AuditSpec, spec, *, S: np.ndarray, scores: dict[str, np.ndarray], rng: np.random.Generator,  # noqa: ANN001
                 q: float, event, eps_accounted: float, eps_released: float, eps_histogram: float | None,  # noqa: ANN001
                 hist_noise_multiplier: float | None, conformance: dict[str, Any], settings: dict[str, Any]) -> AuditResult:
    """The tests of :func:`one_run_tests` on the scores of a finished audit run, as an :class:`AuditResult`
    (``spec``: the audited run's method spec; ``settings``: target-specific entries)."""
    included = S == 1
    tests, best = one_run_tests(scores, included, q=q, steps=prep.plan.steps, delta=prep.spec.delta, beta=audit.beta, rng=rng)
    best_lb = float(best["eps_lower_bound"])
    return AuditResult(
        eps_lower_bound=best_lb,
        confidence=1 - audit.beta,
        eps_accounted=eps_accounted,
        eps_accounted_histogram=eps_histogram,
        eps_target=prep.spec.eps,
        delta=prep.spec.delta,
        violation=best_lb > eps_accounted,
        mechanism=audit.mechanism,
        canaries=audit.canaries,
        included=int(included.sum()),
        steps=prep.plan.steps,
        sample_rate=q,
        hist_noise_multiplier=hist_noise_multiplier,
        best=best,
        tests=tests,
        conformance=conformance,
        seeds={"audit": audit.seed, "run": prep.spec.seed, "sampling": prep.seeds.sampling,
               "noise": None if spec.secure_rng else prep.seeds.noise},
        event=str(event),
        settings={**asdict(audit), "bonferroni_tests": len(tests), "method": prep.spec.method.name,
                  "dataset": prep.spec.dataset.name, "constraint": prep.spec.constraint.name, "sampling": spec.sampling,
                  **settings},
        target=audit.target,
        eps_accounted_released=eps_released,
    )
