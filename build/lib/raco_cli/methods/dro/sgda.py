"""The descent-ascent loops on the minimax form of the DRO problem (not a method:
``dp_sgda``, ``dp_private_diff`` and the non-private ``sgda`` with ``objective=dro`` run them).

The minimax problem is eq. 2 with the simplex constraint moved into a multiplier eta
(:class:`~raco_cli.objectives.dro.Lagrangian`)::

    min_{x, eta[, lambda >= lambda0]} max_{r >= 0} (1/n) sum_i [r_i (l_i(x) - eta) - lambda psi(r_i)] + eta (+ lambda rho)

The max variable is one density ratio ``r_i = n p_i`` per training record.  It is hidden
state that is never released: record i's ratio is updated only when i is sampled, from its
own loss and the released (x, eta, lambda), so it is a function of record i and the earlier
releases.  Everything released is a Gaussian sum of per-record clipped terms:
``grad_x = (1/n) sum_i r_i grad l_i`` and the dual terms ``r_i`` (and ``psi(r_i)`` for kl).
Adding or removing a record adds or removes its own terms only (no normaliser couples the
records, which a projection of p onto the simplex would), so each sum has sensitivity C.

**DP-SGDA** (Yang et al. 2022; the paper's baseline [Rafique et al. 2022]): per step one
Poisson batch B; first one ascent step on the ratios r_i of the records of B (alternating
GDA: a record's ratio was last updated ~1/q steps earlier, when it was last sampled), then
gradients at (x_t, eta_t, r_{t+1}): ``x <- x - lr (noisy sum / qn)``,
``(eta, lambda) <- (eta, lambda) - lr_dual lambda_t grad`` (lambda projected onto [lambda0, inf)),
the ratio step being of size ``options.lr_ratio / lambda_t`` (mirror ascent in log r for kl /
cvar; :meth:`~raco_cli.objectives.divergences.Divergence.ascent`).
DpEvent tree ``SelfComposed(PS(q, Composed[G(sigma), G(sigma_dual)]), T)``: both sums come from
one Poisson sample (accounted jointly, as DP-FERMI's two gradients).

**PrivateDiff Minimax** (Zhang, Lei, Ding, Xiang, Xu, Wang, AAAI 2025, Algorithm 3; the
update as published with the authors' code, github.com/mingxilei/PrivateDiff-Minimax):
round r on one Poisson batch: ``inner_steps`` (T2) ascent steps on the ratios of the batch
(line 4, mini-batch SGA on y); then the gradient estimator of the min variables (x, eta[,
lambda]): at ``r mod T == 0`` (T = ``options.phase``) ``d_r = sum_i clip(grad_i(z_r, y_{r+1}), C1)``,
otherwise ``d_r = sum_i clip(grad_i(z_r, y_{r+1}) - grad_i(z_{r-1}, y_r), C_{2,r})`` with
``C_{2,r} = C2 |x_r - x_{r-1}| + C3`` (``diff_clip_scale``, ``diff_clip_norm``);
``v_{r+1} = d_r / (qn) + v_r + noise`` and ``z <- z - lr v``.  Differences from the printed
algorithm, all on the side of privacy or of the estimator's definition: one Poisson sample
instead of sampling without replacement; the gradient difference is taken on the *same*
record (line 7 pairs z_r^j with z_{r-1}^j, which is not a difference estimator and has no
``|x_r - x_{r-1}|``-bounded sensitivity); clipping per record; and no output perturbation of
y (line 10): the ratios are never released, so there is nothing to perturb.  DpEvent tree:
refresh rounds ``PS(q, Composed[G(sigma_1), G(sigma_dual)])``, the others
``PS(q, Composed[G(sigma_2), G(sigma_dual_diff)])``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa
import torch

from raco_cli.methods.base import MethodSpec, read_options
from raco_cli.methods.dro.common import (
    NOISE_ALLOCATIONS,
    DroRun,
    RefreshDiffReleases,
    Release,
    bool_option,
    choice_option,
    integer_option,
    positive_options,
    refresh_steps,
    x_clip_norm,
)
from raco_cli.methods.dro.engine import Term
from raco_cli.objectives.dro import Lagrangian

SGDA_DEFAULTS: dict[str, Any] = {
    "dual_noise_multiplier": 3.0,  # sigma of the (eta, lambda) gradient sum
    "dual_clip_norm": 10.0,        # C of the per-record dual terms (r_i, psi(r_i))
    "lr_ratio": 0.5,               # ascent step of the per-record ratios r_i
    "max_step": 0.0,               # > 0: |lr v_t| <= max_step (the normalised step)
    "eta_bound": 100.0,            # |eta| <= eta_bound (0: unbounded); lambda <= method.lambda_max
    "clipped": False,              # non-private sgda only: clip both sums as DP-SGDA does, no noise
}  # fmt: skip

DIFF_DEFAULTS: dict[str, Any] = {
    "phase": 10,                        # T of Algorithm 3: restart (refresh) every T rounds
    "inner_steps": 5,                   # T2: ascent steps on the batch's ratios per round
    "lr_ratio": 0.5,
    "diff_noise_multiplier": 3.0,       # sigma_x2 (method.noise_multiplier: sigma_x1)
    "diff_clip_norm": 1.0,              # C3 (method.clip_norm: C1)
    "diff_clip_scale": 1.0,             # C2: C_{2,r} = C2 |x_r - x_{r-1}| + C3
    "dual_noise_multiplier": 3.0,
    "dual_clip_norm": 10.0,
    "dual_diff_noise_multiplier": 3.0,
    "dual_diff_clip_norm": 5.0,
    "noise_allocation": "configured",   # configured: the multipliers above, one factor; equal | theorem: per family (docs/dro.md)
    "max_step": 0.0,
    "eta_bound": 100.0,
}  # fmt: skip


def sgda_options(spec: MethodSpec, defaults: dict[str, Any] = SGDA_DEFAULTS) -> dict[str, Any]:
    o = read_options(spec, defaults)
    positive_options(o, ("dual_noise_multiplier", "dual_clip_norm", "lr_ratio", "max_step", "eta_bound"),
                     allow_zero=("max_step", "eta_bound"))
    bool_option(o, "clipped", "clip the non-private reference's sums as DP-SGDA does (no noise).")
    return o


def diff_options(spec: MethodSpec, defaults: dict[str, Any] = DIFF_DEFAULTS) -> dict[str, Any]:
    o = read_options(spec, defaults)
    o["phase"] = integer_option(o, "phase")
    o["inner_steps"] = integer_option(o, "inner_steps")
    choice_option(o, "noise_allocation", NOISE_ALLOCATIONS,
                  "equal: every release family the same share of the budget; theorem: Theorem 5's multipliers; "
                  "configured: the options' multipliers (docs/dro.md)")
    numbers = tuple(k for k in DIFF_DEFAULTS if k not in ("phase", "inner_steps", "noise_allocation"))
    positive_options(o, numbers, allow_zero=("diff_clip_scale", "max_step", "eta_bound"))
    return o


@dataclass(frozen=True)
class SgdaReleases:
    x: Release
    dual: Release

    @classmethod
    def of(cls, spec: MethodSpec, o: dict[str, Any], *, private: bool = True) -> SgdaReleases:
        """The two releases (``private=False``: the clip norms of a clipped reference, no noise)."""
        return cls(Release("gaussian_x", x_clip_norm(spec), spec.required("noise_multiplier") if private else 0.0),
                   Release("gaussian_dual", o["dual_clip_norm"], o["dual_noise_multiplier"] if private else 0.0))


def sgda_event(spec: MethodSpec, sample_rate: float, steps: int, o: dict[str, Any]) -> dpa.DpEvent:
    rel = SgdaReleases.of(spec, o)
    step = dpa.PoissonSampledDpEvent(sample_rate, dpa.ComposedDpEvent([dpa.GaussianDpEvent(rel.x.sigma), dpa.GaussianDpEvent(rel.dual.sigma)]))
    return dpa.SelfComposedDpEvent(step, int(steps))


def diff_releases(spec: MethodSpec, sample_rate: float, steps: int, o: dict[str, Any], *, private: bool = True) -> RefreshDiffReleases:
    """PrivateDiff's four releases (every round on one Poisson sample at q)."""
    return RefreshDiffReleases.of(spec, o, refresh_rate=sample_rate, diff_rate=sample_rate, steps=steps,
                                  refreshes=refresh_steps(steps, o["phase"]), private=private)


def diff_event(spec: MethodSpec, sample_rate: float, steps: int, o: dict[str, Any]) -> dpa.DpEvent:
    rel = diff_releases(spec, sample_rate, steps, o)

    def joint(a: Release, b: Release) -> dpa.DpEvent:
        return dpa.PoissonSampledDpEvent(sample_rate, dpa.ComposedDpEvent([dpa.GaussianDpEvent(a.sigma), dpa.GaussianDpEvent(b.sigma)]))

    n_ref = refresh_steps(steps, o["phase"])
    parts = [dpa.SelfComposedDpEvent(joint(rel.x_refresh, rel.dual_refresh), n_ref)] if n_ref else []
    if steps - n_ref:
        parts.append(dpa.SelfComposedDpEvent(joint(rel.x_diff, rel.dual_diff), steps - n_ref))
    return dpa.ComposedDpEvent(parts)


def _init(run: DroRun, o: dict[str, Any]) -> tuple[Lagrangian, torch.Tensor, torch.Tensor]:
    lag = Lagrangian.of(run.objective)
    dual = run.project(torch.tensor([0.0, run.objective.lam][: lag.dual_dim], dtype=torch.float64), eta_bound=o["eta_bound"])
    ratios = torch.ones(run.n, dtype=torch.float64, device=run.device)  # r_i = n p_i, uniform p
    return lag, dual, ratios


def _lam(run: DroRun, dual: torch.Tensor) -> float:
    return float(dual[1]) if len(dual) > 1 else run.objective.lam


def _dual_step(run: DroRun, lag: Lagrangian, dual: torch.Tensor, mean_terms: torch.Tensor, eta_bound: float) -> torch.Tensor:
    """``(eta, lambda) <- (eta, lambda) - lr_dual lambda_t grad`` (the step scales with lambda, as
    Double-SPIDER's: the curvature in eta is proportional to 1/lambda), then onto the box
    ``|eta| <= eta_bound``, ``lambda0 <= lambda <= lambda_max`` (:meth:`DroRun.project`)."""
    dual = dual - run.spec.lr_dual * _lam(run, dual) * lag.dual_gradient(mean_terms.to(dual.dtype).cpu())
    return run.project(dual, eta_bound=eta_bound)


def run_sgda(run: DroRun, o: dict[str, Any]) -> list[float]:
    """(DP-)SGDA on the Lagrangian (module docstring); returns the final (eta[, lambda])."""
    lag, dual, ratios = _init(run, o)
    rel = SgdaReleases.of(run.spec, o, private=run.private) if run.clips else None
    expected = run.q * run.size
    run.declare("gaussian_x", "gaussian_dual")
    run.record(0, dual.tolist())
    for t in range(run.steps):
        t0 = time.perf_counter()
        idx, X, y = run.sample(run.q, primal=True)
        ell = run.losses(X, y)
        # ascent first (alternating GDA): a record's ratio was last updated when it was last
        # sampled, ~1/q steps ago; the descent step then uses the refreshed ratios
        r = lag.ascent(ratios.index_select(0, idx), ell, float(dual[0]), _lam(run, dual), o["lr_ratio"])
        ratios[idx] = r  # hidden, never released
        res = run.engine.clipped_sum(X, y, [(None, r)], None if rel is None else rel.x.clip)
        run.note(res.clipped, len(y), res.nonfinite, kind=None if rel is None else rel.x.kind, clip=None if rel is None else rel.x.clip)
        d_sum = run.clip_rows(lag.dual_terms(r), None if rel is None else rel.dual.clip, kind=None if rel is None else rel.dual.kind)
        if rel is not None:
            sums = run.gaussian(rel.x, res.grads)
            d_sum = run.gaussian(rel.dual, [d_sum])[0]
        else:
            sums = res.grads
        run.step([s / expected for s in sums], max_step=o["max_step"])
        dual = _dual_step(run, lag, dual, d_sum / expected, o["eta_bound"])
        run.tick(t + 1, t0, len(y))
        if run.should_record(t + 1):
            run.record(t + 1, dual.tolist())
    return dual.tolist()


def run_private_diff(run: DroRun, o: dict[str, Any]) -> list[float]:
    """PrivateDiff Minimax adapted to the DRO Lagrangian (module docstring)."""
    lag, dual, ratios = _init(run, o)
    rel = diff_releases(run.spec, run.q, run.steps, o) if run.private else None
    expected = run.q * run.size
    run.declare("gaussian_x_refresh", "gaussian_x_diff", "gaussian_dual_refresh", "gaussian_dual_diff")
    x_prev: list[torch.Tensor] | None = None
    v_x: list[torch.Tensor] | None = None
    v_d: torch.Tensor | None = None
    run.record(0, dual.tolist())
    for t in range(run.steps):
        t0 = time.perf_counter()
        refresh = t % o["phase"] == 0 or x_prev is None
        idx, X, y = run.sample(run.q, primal=True)
        ell = run.losses(X, y)
        r_old = ratios.index_select(0, idx)
        r_new = r_old
        for _ in range(o["inner_steps"]):  # line 4: y_{r+1} = mini-batch SGA from y_r
            r_new = lag.ascent(r_new, ell, float(dual[0]), _lam(run, dual), o["lr_ratio"])
        ratios[idx] = r_new
        if refresh:  # line 6
            terms: list[Term] = [(None, r_new)]
            d_rows = lag.dual_terms(r_new)
            rx, rd = (None, None) if rel is None else (rel.x_refresh, rel.dual_refresh)
            clip_x = None if rx is None else rx.clip
        else:  # line 7: the same record at (z_r, y_{r+1}) and (z_{r-1}, y_r)
            assert x_prev is not None
            terms = [(None, r_new), (x_prev, -r_old)]
            d_rows = lag.dual_terms(r_new) - lag.dual_terms(r_old)
            rx, rd = (None, None) if rel is None else (rel.x_diff, rel.dual_diff)
            clip_x = None if rx is None else rx.clip + o["diff_clip_scale"] * run.distance(x_prev)
        res = run.engine.clipped_sum(X, y, terms, clip_x)
        run.note(res.clipped, len(y), res.nonfinite, kind=None if rx is None else rx.kind, clip=clip_x)
        d_sum = run.clip_rows(d_rows, None if rd is None else rd.clip, kind=None if rd is None else rd.kind)
        sums = res.grads
        if rx is not None and rd is not None:  # line 8: noise on each d_r
            sums = run.gaussian(rx, sums, clip=clip_x)
            d_sum = run.gaussian(rd, [d_sum])[0]
        v_x = [s / expected for s in sums] if refresh or v_x is None else [a + s / expected for a, s in zip(v_x, sums)]
        v_d = d_sum / expected if refresh or v_d is None else v_d + d_sum / expected
        x_prev = run.engine.snapshot()
        run.step(v_x, max_step=o["max_step"])  # line 9
        dual = _dual_step(run, lag, dual, v_d, o["eta_bound"])
        run.tick(t + 1, t0, len(y))
        if run.should_record(t + 1):
            run.record(t + 1, dual.tolist())
    return dual.tolist()
