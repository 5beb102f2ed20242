"""The SPIDER loops of the DP-DRO paper (not a method: ``dp_double_spider``,
``dp_recursive_spider`` and the non-private ``spider`` run them).

**Double-SPIDER** (Algorithm 2) on the dual form (eq. 3; :class:`~raco_cli.objectives.dro.DualForm`),
steps t = 0..T-1, phase length q (``options.phase``):

* dual block eta (and lambda for kl), lines 3-8: at ``t mod q == 0`` a refresh on a Poisson
  batch B1 of expected size N1 = ``refresh_batch_factor`` x B, else a correction on B2
  (expected size B): per record the difference of its dual-gradient terms at
  (x_t, eta_t) and (x_{t-1}, eta_{t-1});  ``eta_{t+1} = eta_t - alpha_t g_t`` (lambda projected
  onto [lambda0, inf)) with ``alpha_t = lr_dual * lambda_t``: the analysis takes alpha = 1/(4 L_2)
  and the dual block is L_2-smooth with L_2 proportional to 1/lambda (Lemma 1), so a fixed
  alpha diverges once lambda falls below alpha / 2 (kl, where lambda is a variable);
* x, lines 9-14: the same on B3 / B4 with ``grad_x L_i = (psi*)'(u_i) grad l_i`` at
  (x_t, eta_{t+1}) and, for corrections, minus the record's gradient at (x_{t-1}, eta_t);
  ``x_{t+1} = x_t - beta v_t``.

Privacy (the printed algorithm clips batch *means*, lines 4, 6, 10, 12, whose sensitivity is
2C, not C/N): every release here is ``sum_i clip(term_i, C) + N(0, (sigma C)^2)`` divided by the
batch's *expected* size, with one clip norm and noise multiplier per line
(:class:`~raco_cli.methods.dro.common.RefreshDiffReleases`).  ``diff_clip_scale > 0`` makes the correction clip norms
``scale * |(x_t, eta) - (x_{t-1}, eta')| + C`` (the paper's C_2, C_4 follow these distances):
functions of earlier releases, with the noise std following C, so the accountant sees the
same noise multiplier.  DpEvent tree (independent Poisson samples per line)::

    Composed[SelfComposed(Composed[PS(q1, G(sigma_1)), PS(q1, G(sigma_3))], ceil(T/q)),
             SelfComposed(Composed[PS(q,  G(sigma_2)), PS(q,  G(sigma_4))], T - ceil(T/q))]

**Recursive-SPIDER** (Algorithm 3, KL-constrained eq. 5; :class:`~raco_cli.objectives.dro.Compositional`),
``w = (x, lambda)``, t = 0..T-1 (the printed loop starts at t = 1 and would correct before its
first refresh):

* v (lines 7 / 13): estimator of ``mean grad_x g_i``, ``g_i = exp(l_i / lambda)``: refresh on B1,
  corrections (``grad_x g_i(w_t) - grad_x g_i(w_{t-1})`` per record) on B2;
* u (lines 8 / 14): the same for ``d g_i / d lambda`` on B3 / B4.  What the SPIDER recursions
  track (and what is clipped) are the per-record terms ``lambda grad_x g_i = g_i grad l_i`` and
  ``lambda^2 dg_i/dlambda = -g_i l_i``, rescaled by the public lambda afterwards
  (:meth:`~raco_cli.objectives.dro.Compositional.direction`): the paper's terms grow like
  1/lambda and 1/lambda^2, and a fixed clipping norm would truncate them more and more as
  lambda falls, biasing the lambda-gradient towards lambda0;
* s (line 16): the inner mean ``mean g_i`` by STORM on a Poisson batch B5 of expected size
  ``s_batch_size`` (the paper: one sample):
  ``s_t = (1/b5) sum_i [c_i(w_t) - (1 - beta) c_i(w_{t-1})] + (1 - beta) s_{t-1} + noise``,
  ``c_i = min(g_i, C_5)``; per record ``|c_i(w_t) - (1-beta) c_i(w_{t-1})| <= C_5``.  As printed,
  both c terms are at w_t, which reduces to an exponential average ``beta c_i(w_t)``
  (``options.storm: false``); the text cites STORM, whose correction is at w_{t-1} (default);
* shift (``options.shift``, default on; the paper's g has c = 0): ``g_i = exp((l_i - c) / lambda)``
  with c re-centred at every refresh to the current estimate of ``lambda log mean exp(l/lambda)``
  (``c <- c + lambda_{t-1} log s_{t-1}``, and s rescaled to 1 exactly), a function of earlier
  releases.  Line 18's gradient is the same for every c; without it g spans
  ``exp(l / lambda)``, a fixed C_5 truncates it as lambda falls, the estimate of
  ``KL(p_lambda || uniform)`` collapses, and lambda is driven to lambda0 (measured on Adult);
* z (lines 17-18): ``x <- x - lr (lambda/s) v``; ``lambda <- max(lambda0, lambda - lr_dual lambda
  ((lambda/s) u + log s + rho))``; s is floored at ``s_floor`` first (post-processing).  The
  lambda step is scaled by lambda_t (the paper uses one step size for w = (x, lambda); the
  lambda-gradient ``rho - KL(p_lambda || uniform)`` is dimensionless, and a step proportional to
  lambda keeps it from overshooting lambda0 or blowing up).

DpEvent tree: per step ``Composed[PS(q_v, G), PS(q_u, G), PS(q5, G(sigma_s))]`` with the refresh or
correction rates and noise multipliers, self-composed over the refresh and correction steps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa
import torch

from raco_cli.errors import ConfigError
from raco_cli.methods.base import MethodSpec, read_options
from raco_cli.methods.dro.common import (
    NOISE_ALLOCATIONS,
    DroRun,
    RefreshDiffReleases,
    Release,
    bool_option,
    choice_option,
    phase_of,
    phase_option,
    positive_options,
    refresh_option,
    refresh_steps,
    release_multiplier,
    x_clip_norm,
)
from raco_cli.methods.dro.engine import Term
from raco_cli.objectives.dro import Compositional, DualForm

DOUBLE_DEFAULTS: dict[str, Any] = {
    "phase": "auto",                    # q: a refresh every q steps; auto: Theorem 7's q = (n eps / sqrt(d log 1/delta))^(2/3)
    "refresh_batch_factor": "full",     # N1 = N3: full = every row (Theorems 7-8: b1 = n), or factor x method.batch_size
    "noise_allocation": "equal",        # equal: every release family the same mu-GDP share; theorem: z max(1, r sqrt(k))
                                        # (Theorem 5); configured: the *_noise_multiplier options below, one factor (docs/dro.md)
    "diff_noise_multiplier": 3.0,       # sigma_4: x corrections (configured; method.noise_multiplier: sigma_3, x refreshes)
    "diff_clip_norm": 0.01,             # C_4, the floor of the x corrections' clip norm
    "diff_clip_scale": 2.0,             # C_4 = max(floor, scale |(x_t, eta_{t+1}) - (x_{t-1}, eta_t)|) (Theorem 6); 0: fixed C_4
    "dual_noise_multiplier": 3.0,       # sigma_1: eta (and lambda) refreshes (configured)
    "dual_clip_norm": 10.0,             # C_1 (the terms (psi*)'(u_i) are worst-case weights, mean 1)
    "dual_diff_noise_multiplier": 3.0,  # sigma_2: eta corrections (configured)
    "dual_diff_clip_norm": 0.01,        # C_2, the floor of the dual corrections' clip norm
    "dual_diff_clip_scale": 2.0,        # C_2 = max(floor, scale |(x_t, eta_t) - (x_{t-1}, eta_{t-1})|); 0: fixed C_2
    "max_step": 0.0,                    # > 0: |beta_t v_t| <= max_step (Theorem 7's normalised step beta_t)
    "eta_bound": 100.0,                 # |eta| <= eta_bound (Assumption 3: a bounded dual; 0: unbounded); lambda <= method.lambda_max
    "clipped": False,                   # non-private spider only: clip every estimator as the private method does, no noise
}  # fmt: skip

RECURSIVE_DEFAULTS: dict[str, Any] = {
    "phase": "auto",
    "refresh_batch_factor": "full",       # b1 = b3: full = every row (Theorem 8: b1 = n), or factor x batch_size; b2 = b4 = batch_size
    "noise_allocation": "equal",          # equal | theorem | configured (as Double-SPIDER's)
    "diff_noise_multiplier": 3.0,         # sigma_2: v corrections (configured; method.noise_multiplier: sigma_1, v refreshes)
    "diff_clip_norm": 0.01,               # C_2, the floor of the v corrections' clip norm
    "diff_clip_scale": 2.0,               # C_2 = max(floor, scale |w_t - w_{t-1}|) (Theorem 8: L |w_t - w_{t-1}|); 0: fixed
    "lambda_noise_multiplier": 3.0,       # sigma_3: u refreshes (configured)
    "lambda_clip_norm": 10.0,             # C_3
    "lambda_diff_noise_multiplier": 3.0,  # sigma_4: u corrections (configured)
    "lambda_diff_clip_norm": 0.01,        # C_4, the floor of the u corrections' clip norm
    "lambda_diff_clip_scale": 2.0,        # C_4 = max(floor, scale |w_t - w_{t-1}|); 0: fixed C_4
    "s_noise_multiplier": 3.0,            # sigma_s of line 16 (configured)
    "s_clip_norm": 10.0,                  # C_5: g_i = exp((l_i - c) / lambda) is clipped to [0, C_5]
    "s_batch_size": 128.0,                # expected size of line 16's Poisson batch (the paper: 1)
    "storm_beta": 0.2,                    # beta_t (constant)
    "storm": True,                        # STORM correction at w_{t-1} (false: line 16 as printed)
    "s_floor": 0.1,                       # s is used as max(s, s_floor) in line 18 (log s, lambda / s); s ~ 1 with the shift
    "shift": True,                        # g_i = exp((l_i - c)/lambda), c re-centred at refreshes (false: c = 0, the paper's)
    "max_step": 0.0,
    "clipped": False,
}  # fmt: skip

_NUMBERS_DOUBLE = ("diff_noise_multiplier", "diff_clip_norm", "dual_noise_multiplier", "dual_clip_norm",
                   "dual_diff_noise_multiplier", "dual_diff_clip_norm", "diff_clip_scale", "dual_diff_clip_scale", "max_step",
                   "eta_bound")
_NUMBERS_RECURSIVE = ("diff_noise_multiplier", "diff_clip_norm", "lambda_noise_multiplier", "lambda_clip_norm",
                      "lambda_diff_noise_multiplier", "lambda_diff_clip_norm", "s_noise_multiplier", "s_clip_norm", "s_batch_size",
                      "storm_beta", "s_floor", "diff_clip_scale", "lambda_diff_clip_scale", "max_step")
_ALLOCATION = ("equal: every release family the same share of the budget; theorem: Theorem 5's multipliers; "
               "configured: the options' multipliers (docs/dro.md)")


def _common_options(o: dict[str, Any]) -> None:
    o["phase"] = phase_option(o)
    o["refresh_batch_factor"] = refresh_option(o)
    choice_option(o, "noise_allocation", NOISE_ALLOCATIONS, _ALLOCATION)
    bool_option(o, "clipped", "clip the non-private reference's estimators as the private method does (no noise).")


def double_options(spec: MethodSpec, defaults: dict[str, Any] = DOUBLE_DEFAULTS) -> dict[str, Any]:
    o = read_options(spec, defaults)
    _common_options(o)
    positive_options(o, _NUMBERS_DOUBLE, allow_zero=("diff_clip_scale", "dual_diff_clip_scale", "max_step", "eta_bound"))
    return o


def recursive_options(spec: MethodSpec, defaults: dict[str, Any] = RECURSIVE_DEFAULTS) -> dict[str, Any]:
    o = read_options(spec, defaults)
    _common_options(o)
    positive_options(o, _NUMBERS_RECURSIVE, allow_zero=("diff_clip_scale", "lambda_diff_clip_scale", "max_step"))
    if not 0 < o["storm_beta"] <= 1:
        raise ConfigError(f"method.options.storm_beta must be in (0, 1] (got method.options.storm_beta={o['storm_beta']}); "
                          "the STORM weight beta_t of line 16.")
    for key in ("storm", "shift"):
        bool_option(o, key)
    return o


@dataclass(frozen=True)
class Rates:
    """Poisson rates of a SPIDER step: refreshes, corrections (and line 16's batch)."""

    refresh: float
    diff: float
    s: float = 0.0


def rates(spec: MethodSpec, sample_rate: float, o: dict[str, Any]) -> Rates:
    """From q = B / n: refresh 1 (``full``) or ``min(1, factor q)``, corrections q, line 16
    ``s_batch_size q / B``."""
    s = min(1.0, o["s_batch_size"] * sample_rate / spec.batch_size) if "s_batch_size" in o else 0.0
    factor = o["refresh_batch_factor"]
    refresh = 1.0 if factor == "full" else min(1.0, float(factor) * sample_rate)
    return Rates(refresh=refresh, diff=sample_rate, s=s)


# --- Algorithm 2 -------------------------------------------------------------------------------


def _two_phase_event(refresh: dpa.DpEvent, diff: dpa.DpEvent, steps: int, phase: int) -> dpa.DpEvent:
    n_ref = refresh_steps(steps, phase)
    parts = [dpa.SelfComposedDpEvent(refresh, n_ref)] if n_ref else []
    if steps - n_ref:
        parts.append(dpa.SelfComposedDpEvent(diff, steps - n_ref))
    return dpa.ComposedDpEvent(parts)


def _ps(q: float, release: Release) -> dpa.DpEvent:
    return dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(release.sigma))


def double_releases(spec: MethodSpec, sample_rate: float, steps: int, o: dict[str, Any], *, private: bool = True) -> RefreshDiffReleases:
    """Algorithm 2's four releases of a run of ``steps`` steps (noise per family: ``noise_allocation``)."""
    r = rates(spec, sample_rate, o)
    return RefreshDiffReleases.of(spec, o, refresh_rate=r.refresh, diff_rate=r.diff, steps=steps,
                                  refreshes=refresh_steps(steps, phase_of(o)), private=private)


def double_event(spec: MethodSpec, sample_rate: float, steps: int, o: dict[str, Any]) -> dpa.DpEvent:
    r, rel = rates(spec, sample_rate, o), double_releases(spec, sample_rate, steps, o)
    refresh = dpa.ComposedDpEvent([_ps(r.refresh, rel.dual_refresh), _ps(r.refresh, rel.x_refresh)])
    diff = dpa.ComposedDpEvent([_ps(r.diff, rel.dual_diff), _ps(r.diff, rel.x_diff)])
    return _two_phase_event(refresh, diff, steps, phase_of(o))


def run_double(run: DroRun, o: dict[str, Any]) -> list[float]:
    """Algorithm 2 on ``run`` (module docstring); returns the final dual block."""
    spec, objective = run.spec, run.objective
    form = DualForm.of(objective)
    rel = double_releases(spec, run.q, run.steps, o, private=run.private) if run.clips else None
    r = rates(spec, run.q, o)
    n, phase = run.size, phase_of(o)
    run.declare("gaussian_dual_refresh", "gaussian_dual_diff", "gaussian_x_refresh", "gaussian_x_diff")
    dual = run.project(torch.tensor([0.0, objective.lam][: form.dual_dim], dtype=torch.float64), eta_bound=o["eta_bound"])
    lam_of = (lambda d: float(d[1])) if form.variable_lambda else (lambda d: objective.lam)  # noqa: E731
    x_prev: list[torch.Tensor] | None = None
    dual_prev = dual.clone()
    g_mean: torch.Tensor | None = None  # estimate of the mean dual terms at (x_t, eta_t)
    v: list[torch.Tensor] | None = None  # estimate of grad_x L(x_t, eta_{t+1})
    run.record(0, dual.tolist())
    for t in range(run.steps):
        t0 = time.perf_counter()
        refresh = t % phase == 0 or x_prev is None
        eta, lam = float(dual[0]), lam_of(dual)
        # lines 3-8: the dual block
        _, X, y = run.sample(r.refresh if refresh else r.diff)
        ell = run.losses(X, y)
        if refresh:
            rows = form.dual_terms(ell, eta, lam)
            release, expected = (rel.dual_refresh if rel else None), r.refresh * n
        else:
            assert x_prev is not None
            rows = form.dual_terms(ell, eta, lam) - form.dual_terms(run.losses(X, y, x_prev), float(dual_prev[0]), lam_of(dual_prev))
            release, expected = (rel.dual_diff if rel else None), r.diff * n
        clip = _clip_norm(run, release, None if refresh else x_prev, dual - dual_prev)
        total = run.clip_rows(rows, clip, kind=None if release is None else release.kind)
        if release is not None:
            total = run.gaussian(release, [total], clip=clip)[0]
        g_mean = total / expected if refresh or g_mean is None else g_mean + total / expected
        dual_next = run.project(dual - spec.lr_dual * lam * form.dual_gradient(g_mean), eta_bound=o["eta_bound"])
        # lines 9-14: x at (x_t, eta_{t+1}), corrections against (x_{t-1}, eta_t)
        _, X, y = run.sample(r.refresh if refresh else r.diff, primal=True)
        w_now = form.x_weights(run.losses(X, y), float(dual_next[0]), lam_of(dual_next))
        if refresh:
            terms: list[Term] = [(None, w_now)]
            release, expected = (rel.x_refresh if rel else None), r.refresh * n
        else:
            w_prev = form.x_weights(run.losses(X, y, x_prev), eta, lam)
            terms = [(None, w_now), (x_prev, -w_prev)]
            release, expected = (rel.x_diff if rel else None), r.diff * n
        clip = _clip_norm(run, release, None if refresh else x_prev, dual_next - dual)
        res = run.engine.clipped_sum(X, y, terms, clip)
        run.note(res.clipped, len(y), res.nonfinite, kind=None if release is None else release.kind, clip=clip)
        sums = res.grads if release is None else run.gaussian(release, res.grads, clip=clip)
        v = [s / expected for s in sums] if refresh or v is None else [a + s / expected for a, s in zip(v, sums)]
        x_prev, dual_prev = run.engine.snapshot(), dual
        run.step(v, max_step=o["max_step"])
        dual = dual_next
        run.tick(t + 1, t0, len(y))
        if run.should_record(t + 1):
            run.record(t + 1, dual.tolist())
    return dual.tolist()


def _clip_norm(run: DroRun, release: Release | None, x_prev: list[torch.Tensor] | None, dual_step: torch.Tensor) -> float | None:
    """The clip norm of a release: None without clipping; a refresh's C; a correction's
    ``max(C, scale |(x_t - x_{t-1}, dual difference)|)`` (:meth:`Release.clip_at`; released
    iterates only)."""
    if release is None:
        return None
    if x_prev is None:
        return release.clip
    return release.clip_at((run.distance(x_prev) ** 2 + float((dual_step**2).sum())) ** 0.5)


# --- Algorithm 3 -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recursive:
    """Algorithm 3's five releases."""

    v_refresh: Release
    v_diff: Release
    u_refresh: Release
    u_diff: Release
    s: Release

    @classmethod
    def releases(cls, spec: MethodSpec, sample_rate: float, steps: int, o: dict[str, Any], *, private: bool = True) -> Recursive:
        """The releases of a run of ``steps`` steps (noise per family: ``noise_allocation``, as
        :class:`~raco_cli.methods.dro.common.RefreshDiffReleases`)."""
        r = rates(spec, sample_rate, o)
        n_ref = refresh_steps(steps, phase_of(o))
        n_diff = max(steps - n_ref, 0)

        def sigma(key: str | None, rate: float, count: int) -> float:
            return release_multiplier(spec, o, key, rate, count, private=private)

        return cls(
            v_refresh=Release("gaussian_v_refresh", x_clip_norm(spec), sigma(None, r.refresh, n_ref)),
            v_diff=Release("gaussian_v_diff", o["diff_clip_norm"], sigma("diff_noise_multiplier", r.diff, n_diff),
                           scale=o["diff_clip_scale"], ceiling=x_clip_norm(spec)),
            u_refresh=Release("gaussian_u_refresh", o["lambda_clip_norm"], sigma("lambda_noise_multiplier", r.refresh, n_ref)),
            u_diff=Release("gaussian_u_diff", o["lambda_diff_clip_norm"], sigma("lambda_diff_noise_multiplier", r.diff, n_diff),
                           scale=o["lambda_diff_clip_scale"], ceiling=o["lambda_clip_norm"]),
            s=Release("gaussian_s", o["s_clip_norm"], sigma("s_noise_multiplier", r.s, steps)),
        )


def recursive_event(spec: MethodSpec, sample_rate: float, steps: int, o: dict[str, Any]) -> dpa.DpEvent:
    r, rel = rates(spec, sample_rate, o), Recursive.releases(spec, sample_rate, steps, o)
    s = _ps(r.s, rel.s)
    refresh = dpa.ComposedDpEvent([_ps(r.refresh, rel.v_refresh), _ps(r.refresh, rel.u_refresh), s])
    diff = dpa.ComposedDpEvent([_ps(r.diff, rel.v_diff), _ps(r.diff, rel.u_diff), s])
    return _two_phase_event(refresh, diff, steps, phase_of(o))


def run_recursive(run: DroRun, o: dict[str, Any]) -> list[float]:
    """Algorithm 3 on ``run`` (module docstring); returns ``[lambda]``."""
    spec, objective = run.spec, run.objective
    comp = Compositional.of(objective)
    rel = Recursive.releases(spec, run.q, run.steps, o, private=run.private) if run.clips else None
    r = rates(spec, run.q, o)
    n, phase = run.size, phase_of(o)
    lam_max = max(spec.lambda_max, objective.lambda0)
    run.declare("gaussian_v_refresh", "gaussian_v_diff", "gaussian_u_refresh", "gaussian_u_diff", "gaussian_s")
    lam = min(max(objective.lam, objective.lambda0), lam_max)
    lam_prev = lam
    x_prev: list[torch.Tensor] | None = None
    v: list[torch.Tensor] | None = None
    u = 0.0
    s: float | None = None
    c = 0.0  # the shift of g (module docstring)
    beta = o["storm_beta"]
    run.record(0, [lam])
    for t in range(run.steps):
        t0 = time.perf_counter()
        refresh = t % phase == 0 or x_prev is None
        step_rate, expected = (r.refresh, r.refresh * n) if refresh else (r.diff, r.diff * n)
        if refresh and o["shift"] and s is not None:  # re-centre: s estimated mean exp((l - c)/lambda_{t-1})
            c, s = c + lam_prev * math.log(max(s, o["s_floor"])), 1.0
        # v: mean grad_x g at w_t (lines 5-7, 10-13)
        _, X, y = run.sample(step_rate, primal=True)
        batch_rows = len(y)
        terms: list[Term] = [(None, comp.x_weights(run.losses(X, y), lam, c))]
        if not refresh:
            terms.append((x_prev, -comp.x_weights(run.losses(X, y, x_prev), lam_prev, c)))
        release = None if rel is None else (rel.v_refresh if refresh else rel.v_diff)
        clip = _clip_norm(run, release, None if refresh else x_prev, torch.tensor([lam - lam_prev]))
        res = run.engine.clipped_sum(X, y, terms, clip)
        run.note(res.clipped, len(y), res.nonfinite, kind=None if release is None else release.kind, clip=clip)
        sums = res.grads if release is None else run.gaussian(release, res.grads, clip=clip)
        v = [g / expected for g in sums] if refresh or v is None else [a + g / expected for a, g in zip(v, sums)]
        # u: mean d g / d lambda at w_t (lines 8, 14)
        _, X, y = run.sample(step_rate)
        rows = comp.lam_terms(run.losses(X, y), lam, c)[:, None]
        if not refresh:
            rows = rows - comp.lam_terms(run.losses(X, y, x_prev), lam_prev, c)[:, None]
        release = None if rel is None else (rel.u_refresh if refresh else rel.u_diff)
        clip = _clip_norm(run, release, None if refresh else x_prev, torch.tensor([lam - lam_prev]))
        total = run.clip_rows(rows, clip, kind=None if release is None else release.kind)
        if release is not None:
            total = run.gaussian(release, [total], clip=clip)[0]
        u = float(total[0]) / expected if refresh else u + float(total[0]) / expected
        # s: STORM estimate of mean g (line 16) on its own Poisson batch
        _, X, y = run.sample(r.s)
        c_cap = rel.s.clip if rel is not None else None
        c_now = _capped(comp.g(run.losses(X, y), lam, c), c_cap)
        if s is None:
            h = c_now
        elif o["storm"]:
            assert x_prev is not None
            h = c_now - (1.0 - beta) * _capped(comp.g(run.losses(X, y, x_prev), lam_prev, c), c_cap)
        else:  # line 16 as printed: both terms at w_t
            h = beta * c_now
        total = run.clip_rows(h[:, None], c_cap, kind=None if rel is None else rel.s.kind)
        if rel is not None:
            total = run.gaussian(rel.s, [total])[0]
        fresh = float(total[0]) / (r.s * n)
        s = fresh if s is None else (1.0 - beta) * s + fresh
        # lines 17-18
        zx, zl = comp.direction(max(s, o["s_floor"]), v, u, lam)
        x_prev, lam_prev = run.engine.snapshot(), lam
        run.step(zx, max_step=o["max_step"])
        lam = min(max(objective.lambda0, lam - spec.lr_dual * lam * zl), lam_max)
        run.tick(t + 1, t0, batch_rows)
        if run.should_record(t + 1):
            run.record(t + 1, [lam])
    return [lam]


def _capped(g: torch.Tensor, cap: float | None) -> torch.Tensor:
    return g if cap is None else g.clamp(max=cap)
