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
  20): data-independent, so it costs no privacy.  ``last`` and ``best_feasible`` work as for
  every method (``best_feasible`` is best-on-validation under scope=paper).
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
        clip: per-record clipping norm C (the l2 sensitivity of the sum under add/remove).
        sigma: noise multiplier (noise std / C), what the accountant sees.
    """

    kind: str
    clip: float
    sigma: float


@dataclass(frozen=True)
class RefreshDiffReleases:
    """The four releases of a refresh / correction scheme on (x, dual block): a large-batch
    refresh and a gradient-difference correction for each block.  DP Double-SPIDER (Algorithm 2)
    and PrivateDiff use the same releases, kinds and options."""

    dual_refresh: Release
    dual_diff: Release
    x_refresh: Release
    x_diff: Release

    @classmethod
    def of(cls, spec: MethodSpec, o: dict[str, Any]) -> RefreshDiffReleases:
        return cls(
            dual_refresh=Release("gaussian_dual_refresh", o["dual_clip_norm"], o["dual_noise_multiplier"]),
            dual_diff=Release("gaussian_dual_diff", o["dual_diff_clip_norm"], o["dual_diff_noise_multiplier"]),
            x_refresh=Release("gaussian_x_refresh", spec.required("clip_norm"), spec.required("noise_multiplier")),
            x_diff=Release("gaussian_x_diff", o["diff_clip_norm"], o["diff_noise_multiplier"]),
        )


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
    ) -> None:
        self.data, self.model, self.spec, self.device, self.reporter = data, model, spec, device, reporter
        self.objective, self.private, self.steps = spec.objective, private, steps
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

    def clip(self, release: Release, scale: float = 1.0) -> float | None:
        """The clipping norm of a release (None: non-private, no clipping)."""
        return release.clip * scale if self.private else None

    def gaussian(self, release: Release, sums: list[torch.Tensor], *, clip: float | None = None) -> list[torch.Tensor]:
        """``sums + N(0, (sigma C)^2)`` through the release layer (``clip``: the C actually used,
        e.g. an adaptive one; default ``release.clip``); unchanged when not private."""
        if not self.private:
            return sums
        std = release.sigma * (release.clip if clip is None else clip)
        self.counts[release.kind] = self.counts.get(release.kind, 0) + 1
        g = self.g_noise
        return releases.release(release.kind, lambda: [s + gaussian_noise(tuple(s.shape), std, g, dtype=s.dtype).to(s.device) for s in sums])

    def note(self, clipped: torch.Tensor, rows: int, nonfinite: torch.Tensor | int = 0) -> None:
        self.clipped += int(clipped)
        self.clip_rows_seen += rows
        self.nonfinite += int(nonfinite)

    def clip_rows(self, rows: torch.Tensor, clip: float | None) -> torch.Tensor:
        """``sum_i clip(rows_i, C)`` of per-record dual terms (b, m) (plain sum when C is None)."""
        total, clipped = clip_rows(rows, clip)
        self.note(clipped, len(rows))
        return total

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
                "nonfinite_rows": float(self.nonfinite),
                "time_per_step_ms": self.clock.steady_ms,
                "first_step_ms": self.clock.first_ms,
                "sample_rate": self.q,
                "random_iterate_step": self.tau,
            },
            releases=dict(self.counts),
        )
