"""What the DRO methods share (not a method): setup, Poisson batches, Gaussian releases,
evaluation of the robust objective, and the random-iterate output.

* Every batch is a Poisson sample (each training row independently, at the release's rate);
  empty batches are a normal path (the release is then pure noise).
* Every noisy release is ``sum_i clip(v_i, C) + N(0, (sigma C)^2 I)`` computed through
  :func:`raco_cli.privacy.releases.release` (the replay tape) and counted by kind
  (``gaussian_*``: the contract test matches the counts with the accounted DpEvent leaves).
  A method's non-private reference (``spider``, ``sgda``) runs the same loop with no
  clipping and no noise.
* Evaluation (every ``eval_every`` steps and at the random iterate): the usual metrics of
  :func:`raco_cli.methods.training.evaluate_all`, plus on each split the robust objective F(x)
  and the norm of its gradient ``|grad F(x)| = |sum_i p*_i grad l_i(x)|`` (the paper's
  stationarity measure, Definition 4; p* the exact worst case of
  :func:`raco_cli.objectives.dro.worst_case`) and, under ``privacy.scope=paper``, the
  membership-inference AUCs of :mod:`raco_cli.metrics.membership` (train vs validation rows).  Under ``scope=model`` only
  the test split is evaluated this way (the train split's gradient norm is an exact training
  statistic).
* ``method.selection=random``: the output is the iterate of a step tau drawn uniformly from
  1..T *before* training, from the selection seed (Algorithm 2 line 17, Algorithm 3 line
  20): data-independent, so it costs no privacy.  ``last`` (the default), ``best_feasible``
  (best-on-validation under scope=paper) and ``average`` work as for every method; the tail
  mean's robust objective is evaluated on it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods import training
from raco_cli.methods.base import MethodSpec, Reporter, Seeds, TrainResult
from raco_cli.methods.dro.engine import Point, clip_rows, record_engine
from raco_cli.methods.timing import StepClock
from raco_cli.metrics.membership import membership_inference
from raco_cli.objectives.dro import worst_case
from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import (
    gaussian_noise,
    noise_source,
    poisson_sample,
    sampling_generator,
)


@dataclass(frozen=True)
class Release:
    """One Gaussian release of a clipped sum.

    Attributes:
        kind: release kind (``gaussian_*``), the key of the counts and of the replay tape.
        clip: per-record clipping norm C (the l2 sensitivity of the sum under add/remove); with
            ``scale > 0`` the floor of the adaptive clip norm.
        sigma: noise multiplier (noise std / C), what the accountant sees.
        scale: > 0: a correction's clip norm follows the iterate difference,
            ``C_t = max(C, min(ceiling, scale |(x_t, dual_t) - (x_{t-1}, dual_{t-1})|))``
            (Theorem 6's C_2, C_4 are proportional to these differences): a function of earlier
            releases only, never of the data, and the noise std follows it (``sigma C_t``), so
            the accountant sees the same multiplier.
        ceiling: the adaptive clip norm's cap, the block's refresh clip norm.  Without it the
            clip is a feedback loop when the step is not normalised (Theorem 7 normalises it):
            a larger step gives a larger clip, so more noise, so a larger step (digits-ST MLP,
            eps 1: C_t reached 7.8 and the training objective 198).
    """

    kind: str
    clip: float
    sigma: float
    scale: float = 0.0
    ceiling: float = math.inf

    def clip_at(self, distance: float | None) -> float:
        """The clip norm at iterate difference ``distance`` (None: a refresh, the fixed C).

        >>> r = Release("gaussian_x_diff", 0.01, 3.0, scale=2.0, ceiling=1.5)
        >>> r.clip_at(None), r.clip_at(0.001), r.clip_at(0.5), r.clip_at(4.0)
        (0.01, 0.01, 1.0, 1.5)
        """
        if self.scale <= 0 or distance is None:
            return self.clip
        return max(self.clip, min(self.ceiling, self.scale * distance))


NOISE_ALLOCATIONS = ("equal", "theorem", "configured")


def family_multiplier(z: float, rate: float, count: int, rule: str = "equal") -> float:
    """The noise multiplier of a family of ``count`` releases at Poisson rate ``rate`` when the
    budget is allocated per release family (``options.noise_allocation``); ``z`` is
    ``method.noise_multiplier``, the one number the planner calibrates so that the whole run
    spends eps (PLD), so every rule stays inside the planned budget.

    * ``theorem``: ``z max(1, r sqrt(k))``, the paper's Theorem 5 per family with one constant
      for every family.  On the mean, Theorem 5's noise is ``c C sqrt(log 1/delta) / eps *
      max(1/b, sqrt(k)/n)``; times b / C it is this.  Full refreshes (r = 1, k = T/q) get
      ``z sqrt(T/q)``, Theorem 6's sigma_1 and sigma_3.  Its ``max(1, .)`` gives a family of
      rarely sampled releases (r sqrt(k) < 1) the multiplier z however little it costs.
    * ``equal``: every family gets the same share of the budget in Gaussian differential privacy
      (mu-GDP): mu = 1/z per family, where a full-batch family of k Gaussians is
      ``sqrt(k)/sigma``-GDP (exact) and a Poisson-subsampled one ``r sqrt(k (e^{1/sigma^2} - 1))``
      (the central-limit approximation of Bu, Dong, Long, Su 2020, used only to split the
      budget; eps is the PLD's).  So ``sigma = z sqrt(k)`` at r = 1 and
      ``sigma = 1 / sqrt(log(1 + 1/(z^2 r^2 k)))`` below; it tends to Theorem 5's ``z r sqrt(k)``
      when that is large.

    >>> family_multiplier(2.0, 1.0, 16, "theorem"), family_multiplier(2.0, 0.01, 100, "theorem")
    (8.0, 2.0)
    >>> family_multiplier(2.0, 1.0, 16), round(family_multiplier(2.0, 0.01, 100), 3), round(family_multiplier(50.0, 0.01, 10000), 2)
    (8.0, 0.554, 50.0)
    """
    k = max(count, 1)
    if rule == "theorem":
        return z * max(1.0, rate * math.sqrt(k))
    if rate >= 1.0:
        return z * math.sqrt(k)
    return 1.0 / math.sqrt(math.log1p(1.0 / (z * z * rate * rate * k)))


def release_multiplier(spec: MethodSpec, o: dict[str, Any], key: str | None, rate: float, count: int, *,
                       private: bool = True) -> float:
    """The noise multiplier of one release family of a refresh / correction scheme: 0 for the
    clipped, noise-free estimators of a non-private reference; under ``options.noise_allocation``
    ``equal`` or ``theorem`` :func:`family_multiplier` of ``count`` releases at Poisson rate
    ``rate``; under ``configured`` the option ``key`` (None: ``method.noise_multiplier``)."""
    if not private:
        return 0.0
    rule = o.get("noise_allocation", "configured")
    if rule != "configured":
        return family_multiplier(spec.required("noise_multiplier"), rate, count, rule)
    return spec.required("noise_multiplier") if key is None else float(o[key])


@dataclass(frozen=True)
class RefreshDiffReleases:
    """The four releases of a refresh / correction scheme on (x, dual block): a large-batch
    refresh and a gradient-difference correction for each block.  DP Double-SPIDER (Algorithm 2)
    and PrivateDiff use the same releases, kinds and options.

    Noise (``options.noise_allocation``): ``configured`` takes each release's multiplier from
    its option (the planner scales them all by one factor); ``equal`` and ``theorem`` set each
    family's multiplier by :func:`family_multiplier` from its own rate and count
    (``refresh_rate`` and ``refreshes``, ``diff_rate`` and the other ``steps - refreshes``),
    inside the one planned budget."""

    dual_refresh: Release
    dual_diff: Release
    x_refresh: Release
    x_diff: Release

    @classmethod
    def of(cls, spec: MethodSpec, o: dict[str, Any], *, refresh_rate: float, diff_rate: float, steps: int,
           refreshes: int, private: bool = True) -> RefreshDiffReleases:
        def sigma(key: str | None, rate: float, count: int) -> float:
            return release_multiplier(spec, o, key, rate, count, private=private)

        n_diff = max(steps - refreshes, 0)
        return cls(
            dual_refresh=Release("gaussian_dual_refresh", o["dual_clip_norm"], sigma("dual_noise_multiplier", refresh_rate, refreshes)),
            dual_diff=Release("gaussian_dual_diff", o["dual_diff_clip_norm"], sigma("dual_diff_noise_multiplier", diff_rate, n_diff),
                              scale=float(o.get("dual_diff_clip_scale", 0.0)), ceiling=o["dual_clip_norm"]),
            x_refresh=Release("gaussian_x_refresh", x_clip_norm(spec), sigma(None, refresh_rate, refreshes)),
            x_diff=Release("gaussian_x_diff", o["diff_clip_norm"], sigma("diff_noise_multiplier", diff_rate, n_diff),
                           scale=float(o.get("diff_clip_scale", 0.0)), ceiling=x_clip_norm(spec)),
        )


def x_clip_norm(spec: MethodSpec) -> float:
    """``method.clip_norm`` (a non-private reference with ``options.clipped: true`` needs it too)."""
    if spec.clip_norm is None:
        raise ConfigError(f"method.clip_norm must be set for method {spec.name} with clipped estimators (got null); "
                          "set method.clip_norm=1.0, or method.options.clipped=false for the unclipped reference.")
    return float(spec.clip_norm)


def require_dro(spec: MethodSpec, *, name: str, kl_only: bool = False) -> None:
    """A DRO method needs ``objective=dro`` (Algorithm 3: the KL-constrained form).

    Raises:
        UnsupportedError: the objective (or divergence) does not fit the method.
    """
    if not spec.objective.is_dro:
        raise UnsupportedError(f"method={name} optimises the DRO objective; add objective=dro (docs/dro.md).")
    if kl_only and not spec.objective.compositional:
        raise UnsupportedError(
            f"method={name} solves the KL-constrained compositional form (eq. 5), not divergence "
            f"'{spec.objective.divergence}'. Use objective.divergence=kl, or method=dp_double_spider for any divergence."
        )


def positive_options(o: dict[str, Any], keys: tuple[str, ...], *, allow_zero: tuple[str, ...] = ()) -> None:
    """One-line errors for non-positive numeric options."""
    for key in keys:
        value = o[key]
        bad = value < 0 if key in allow_zero else value <= 0
        if bad:
            bound = ">= 0" if key in allow_zero else "> 0"
            raise ConfigError(f"method.options.{key} must be {bound} (got method.options.{key}={value}).")


def integer_option(o: dict[str, Any], key: str, *, minimum: int = 1) -> int:
    value = o[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"method.options.{key} must be an integer >= {minimum} (got method.options.{key}={o[key]!r}).")
    return value


def noise_ratio(*, n: int, eps: float, delta: float, dim: int) -> float:
    """``sqrt(d log(1/delta)) / (n eps)``: the privacy term of the paper's utility bounds
    (Theorems 2, 4), the scale at which privacy noise dominates (>= ~0.1) or not.

    Adult (28 828 training rows, logistic regression: d = 206) at eps = 0.5:

    >>> round(noise_ratio(n=28828, eps=0.5, delta=28828 ** -1.1, dim=206), 4)
    0.0033
    """
    return math.sqrt(dim * math.log(1.0 / delta)) / (n * eps)


def theorem_phase(*, n: int, eps: float | None, delta: float, dim: int, private: bool = True) -> int:
    """The phase q of the SPIDER methods by default: ``q = (n eps / sqrt(d log(1/delta)))^(2/3)``
    (Theorem 7; Theorem 8's q at its T, with the unknown constants G, L, Psi_0 set to 1), at
    least 1.  A non-private reference (no eps) takes SPIDER's own ``q = sqrt(n)`` (Fang et al. 2018).

    >>> theorem_phase(n=28828, eps=1.0, delta=28828 ** -1.1, dim=206)
    71
    >>> theorem_phase(n=10000, eps=None, delta=1e-5, dim=10, private=False)
    100
    """
    if not private or eps is None or not math.isfinite(eps):
        return max(1, round(math.sqrt(n)))
    return max(1, round(noise_ratio(n=n, eps=eps, delta=delta, dim=dim) ** (-2.0 / 3.0)))


def phase_of(o: dict[str, Any]) -> int:
    """``options.phase`` as an integer (``auto`` is resolved by the run before planning).

    Raises:
        ConfigError: ``auto`` left unresolved (a direct call of the method outside ``raco train``).
    """
    phase = o["phase"]
    if phase == "auto":
        raise ConfigError("method.options.phase=auto is resolved by `raco train` from n, eps, delta and the model size "
                          "(Theorem 7); outside a run give an integer, e.g. method.options.phase=10.")
    return int(phase)


def phase_option(o: dict[str, Any]) -> int | str:
    """Check ``options.phase``: ``auto`` or an integer >= 1."""
    if o["phase"] == "auto":
        return "auto"
    try:
        return integer_option(o, "phase")
    except ConfigError:
        raise ConfigError(f"method.options.phase must be auto or an integer >= 1 (got method.options.phase={o['phase']!r}); "
                          "auto: Theorem 7's q from n, eps, delta and the model size.") from None


def refresh_option(o: dict[str, Any]) -> float | str:
    """Check ``options.refresh_batch_factor``: ``full`` (every row, the paper's N1 = n) or a number > 0."""
    value = o["refresh_batch_factor"]
    if value == "full":
        return "full"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"method.options.refresh_batch_factor must be full or a number > 0 (got "
                          f"method.options.refresh_batch_factor={value!r}); full: refreshes on every row (Theorems 7-8, "
                          "b1 = n), a number: that many times method.batch_size.")
    return float(value)


def choice_option(o: dict[str, Any], key: str, choices: tuple[str, ...], meaning: str) -> str:
    if o[key] not in choices:
        raise ConfigError(f"method.options.{key} must be one of {', '.join(choices)} (got method.options.{key}={o[key]!r}); {meaning}")
    return str(o[key])


def bool_option(o: dict[str, Any], key: str, meaning: str = "") -> bool:
    if not isinstance(o[key], bool):
        raise ConfigError(f"method.options.{key} must be true or false (got method.options.{key}={o[key]!r})"
                          + (f"; {meaning}" if meaning else "."))
    return bool(o[key])


def refresh_steps(steps: int, phase: int) -> int:
    """Number of refresh steps among t = 0..T-1 (``t mod q == 0``).

    >>> refresh_steps(25, 10), refresh_steps(0, 10), refresh_steps(10, 1)
    (3, 0, 10)
    """
    return (steps + phase - 1) // phase if steps > 0 else 0


class DroRun:
    """The state every DRO method's loop shares; the method owns the update rule."""

    def __init__(
        self,
        data: TabularData,
        model: nn.Module,
        constraints: ConstraintSet,
        spec: MethodSpec,
        *,
        steps: int,
        seeds: Seeds,
        device: torch.device,
        reporter: Reporter,
        private: bool,
        clipped: bool = False,
    ) -> None:
        self.data, self.model, self.spec, self.device, self.reporter = data, model, spec, device, reporter
        self.objective, self.private, self.steps = spec.objective, private, steps
        # private runs clip every release; a non-private reference with options.clipped does too
        # (the same clip norms, no noise: "clipped, noise-free estimators")
        self.clips = private or clipped
        self.train_idx = np.asarray(data.splits["train"])
        self.n = len(self.train_idx)  # rows to sample from (and the ratios' length)
        self.size = spec.size_of(self.n)  # the public size: rates and normalisers (privacy/size.py)
        self.q = min(1.0, spec.batch_size / self.size)
        self.rows = training.Rows(data, self.train_idx, np.zeros(self.n, dtype=np.int64), device, pack=False)
        training.initialize(model, seeds.init)
        model.to(device)
        self.engine = record_engine(model, micro_batch=spec.micro_batch, precision=spec.precision, device=device)
        self.optimizer = training.make_optimizer(self.engine.params, spec)
        self.g_sample = sampling_generator(seeds.sampling, secure=spec.secure_rng)
        self.g_noise = noise_source(seeds.noise, device, secure=spec.secure_rng)
        # the checkpoints keep the last evaluation for selection=random; the random iterate is ours
        checkpoint_spec = replace(spec, selection="last") if spec.selection == "random" else spec
        self.checkpoints = training.Checkpoints(
            self.engine, model, data, constraints, checkpoint_spec, device=device, reporter=reporter, selection_seed=seeds.selection,
            steps=steps,
        )
        self.tau = int(np.random.default_rng(seeds.selection).integers(1, steps + 1)) if spec.selection == "random" and steps > 0 else None
        self.tau_index: int | None = None
        self.tau_state: dict[str, torch.Tensor] | None = None
        self.counts: dict[str, int] = {}
        self.clock = StepClock()
        self.primal_rows = 0  # rows of the x-gradient batches (mean_batch_size)
        self.clipped = 0
        self.clip_rows_seen = 0
        self.nonfinite = 0
        # per release kind: [clipped rows, rows, sum of the clip norms used, releases]
        self.by_kind: dict[str, list[float]] = {}

    # --- batches and releases ---------------------------------------------------------------

    def sample(self, sample_rate: float, *, primal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A Poisson batch at ``sample_rate``: (training-row indices, X, y)."""
        idx = poisson_sample(self.n, sample_rate, self.g_sample, self.device)[0]
        b = self.rows.batch(idx, labels=True)
        if primal:
            self.primal_rows += len(idx)
        return idx, b["X"], b["y"]

    def declare(self, *kinds: str) -> None:
        """Release kinds of the method (all counted, 0 when unused)."""
        for kind in kinds:
            self.counts.setdefault(kind, 0)

    def release_of(self, release: Release | None) -> Release | None:
        """``release`` when this run clips (private, or a clipped reference), else None."""
        return release if self.clips else None

    def gaussian(self, release: Release, sums: list[torch.Tensor], *, clip: float | None = None) -> list[torch.Tensor]:
        """``sums + N(0, (sigma C)^2)`` through the release layer (``clip``: the C actually used,
        e.g. an adaptive one; default ``release.clip``); unchanged when not private."""
        if not self.private:
            return sums
        std = release.sigma * (release.clip if clip is None else clip)
        self.counts[release.kind] = self.counts.get(release.kind, 0) + 1
        g = self.g_noise
        return releases.release(release.kind, lambda: [s + gaussian_noise(tuple(s.shape), std, g, dtype=s.dtype).to(s.device) for s in sums])

    def note(self, clipped: torch.Tensor | int, rows: int, nonfinite: torch.Tensor | int = 0, *, kind: str | None = None,
             clip: float | None = None) -> None:
        """Count the clipped rows of one release (``kind``: per release, ``stats.clip_fraction_by_release``)."""
        self.clipped += int(clipped)
        self.clip_rows_seen += rows
        self.nonfinite += int(nonfinite)
        if kind is not None and clip is not None:
            entry = self.by_kind.setdefault(kind, [0.0, 0.0, 0.0, 0.0])
            entry[0] += int(clipped)
            entry[1] += rows
            entry[2] += clip
            entry[3] += 1

    def clip_rows(self, rows: torch.Tensor, clip: float | None, *, kind: str | None = None) -> torch.Tensor:
        """``sum_i clip(rows_i, C)`` of per-record dual terms (b, m) (plain sum when C is None)."""
        total, clipped = clip_rows(rows, clip)
        self.note(clipped, len(rows), kind=kind, clip=clip)
        return total

    def project(self, dual: torch.Tensor, *, eta_bound: float) -> torch.Tensor:
        """The dual block onto its box: ``|eta| <= eta_bound`` (0: unbounded) and, for the
        KL-constrained form, ``lambda0 <= lambda <= method.lambda_max`` (the paper's Assumption 3
        bounds the conjugate's domain; post-processing, free)."""
        dual = dual.clone()
        if eta_bound > 0:
            dual[0] = dual[0].clamp(-eta_bound, eta_bound)
        if len(dual) > 1:
            dual[1] = dual[1].clamp(min=self.objective.lambda0, max=max(self.spec.lambda_max, self.objective.lambda0))
        return dual

    def losses(self, X: torch.Tensor, y: torch.Tensor, point: Point = None) -> torch.Tensor:
        return self.engine.losses(X, y, point).double()

    def step(self, direction: list[torch.Tensor], *, max_step: float = 0.0) -> None:
        """``x <- x - lr d`` (the method's optimizer); ``max_step > 0`` caps ``|lr d|`` (the
        normalised step ``beta_t = min(lr, max_step / |d|)`` of Algorithm 2's analysis)."""
        scale = 1.0
        if max_step > 0:
            norm = math.sqrt(sum(float((d * d).sum()) for d in direction))
            if self.spec.lr * norm > max_step:
                scale = max_step / (self.spec.lr * norm)
        self.optimizer.step([d.to(p.dtype) for d, p in zip(direction, self.engine.params)], scale=scale)

    def distance(self, point: list[torch.Tensor]) -> float:
        """``|x_t - point|``: a function of earlier releases (adaptive clipping norms)."""
        return math.sqrt(sum(float(((p.detach() - q) ** 2).sum()) for p, q in zip(self.engine.params, point)))

    # --- evaluation and output ---------------------------------------------------------------

    def record(self, step: int, dual: list[float]) -> None:
        """Evaluate (with the robust objective), keep the random iterate when ``step == tau``."""
        self.checkpoints.record(step, dual, extra=self._robust_metrics())
        if step == self.tau:
            self.tau_index = len(self.checkpoints.history) - 1
            self.tau_state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def should_record(self, step: int) -> bool:
        return step % self.spec.eval_every == 0 or step == self.steps or step == self.tau

    def tick(self, step: int, t0: float, primal_batch: int) -> None:
        self.clock.add(time.perf_counter() - t0)
        self.reporter.on_step(step, self.steps, {"batch": float(primal_batch)})

    @torch.no_grad()
    def _split_logits(self, split: str) -> tuple[np.ndarray, torch.Tensor]:
        idx = np.asarray(self.data.splits[split])
        return idx, torch.as_tensor(training.predict_logits(self.engine, self.data, idx, self.device))

    def _robust_metrics(self) -> dict[str, dict[str, Any]]:
        paper = self.spec.scope == "paper"
        out: dict[str, dict[str, Any]] = {}
        logits: dict[str, tuple[np.ndarray, torch.Tensor]] = {}
        for split in ("train", "test") if paper else ("test",):
            idx, z = self._split_logits(split)
            logits[split] = (idx, z)
            y = torch.as_tensor(self.data.y[idx])
            ell = nn.functional.cross_entropy(z, y, reduction="none")
            wc = worst_case(ell, self.objective)
            out[split] = {"grad_norm": self._weighted_gradient_norm(idx, wc.weights), "dro_objective": wc.value}
        if paper:  # members: training rows; non-members: validation rows, the same population
            (i_in, z_in), (i_out, z_out) = logits["train"], self._split_logits("val")
            out["mia"] = membership_inference(z_in.numpy(), self.data.y[i_in], z_out.numpy(), self.data.y[i_out])
        return out

    def _weighted_gradient_norm(self, idx: np.ndarray, weights: torch.Tensor) -> float:
        """``|sum_i p_i grad l_i(x)|`` over the rows ``idx`` (chunked, no clipping)."""
        total: list[torch.Tensor] | None = None
        chunk = max(1, int(getattr(self.engine, "eval_chunk", 8192)))
        for start in range(0, len(idx), chunk):
            rows = idx[start : start + chunk]
            X = training.to_device(self.data.rows(rows), self.device)
            y = torch.as_tensor(self.data.y[rows], dtype=torch.long, device=self.device)
            w = weights[start : start + chunk].to(self.device, torch.float32)
            grads = self.engine.clipped_sum(X, y, [(None, w)], None).grads
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        return math.sqrt(sum(float((g.double() ** 2).sum()) for g in total or []))

    def finish(self, dual: list[float]) -> TrainResult:
        history, selected, state = self.checkpoints.finish()
        if self.spec.selection == "average":  # the tail mean (loaded by finish) is a new model: its F and |grad F| too
            for key, values in self._robust_metrics().items():
                history[selected].metrics[key] = {**history[selected].metrics.get(key, {}), **values}
        if self.tau_state is not None and self.tau_index is not None:
            selected, state = self.tau_index, self.tau_state
            self.model.load_state_dict(state)
        T = max(self.steps, 1)
        return TrainResult(
            history=history,
            selected=selected,
            steps=self.steps,
            lam=dual,
            state_dict=state,
            stats={
                "mean_batch_size": self.primal_rows / T,
                "clip_fraction": self.clipped / max(self.clip_rows_seen, 1),
                # per release: the fraction of clipped rows and the mean clip norm used (a clip
                # norm that clips most rows, or none, is set wrong; docs/dro.md)
                "clip_fraction_by_release": {k: v[0] / max(v[1], 1.0) for k, v in sorted(self.by_kind.items())},
                "clip_norm_by_release": {k: v[2] / max(v[3], 1.0) for k, v in sorted(self.by_kind.items())},
                "nonfinite_rows": float(self.nonfinite),
                "time_per_step_ms": self.clock.steady_ms,
                "first_step_ms": self.clock.first_ms,
                "sample_rate": self.q,
                "random_iterate_step": self.tau,
            },
            releases=dict(self.counts),
        )
