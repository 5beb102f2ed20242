"""The stochastic gradient descent-ascent loop shared by raco_dp, dp_sgd, sgda and sgd.

One step t (paper Algorithm 1, lines 3-13), each stage switched by :class:`CoreFlags`:

1. Poisson-sample the gradient batch B (rate q = batch_size / n_train).
2. Histogram (``constrained``): on B (``shared``) or on an independent Poisson sample
   (``independent``), ``H[q, k] = sum_{x in D_q} sigma_tau(h(x))_k`` (eq. 8; arg-max one-hots
   for ``dual=hard``), plus i.i.d. Laplace(b) on every cell (``hist_noise``, eq. 9).
3. Primal (eq. 10): per-sample gradients of ``loss_i + q|D| * R_hat_i`` with denominators read
   from H (clamped), clipped to C and summed (``private``), plus N(0, (sigma C)^2)
   (``private``), divided by q|D|, then one optimizer step.
4. Dual (eq. 12): ``lambda <- clip(lambda + eta_lambda (Gamma_post(H) - gamma), 0, lambda_max)``.

Evaluation every ``eval_every`` steps on train/val/test uses exact predictions; selection
follows :class:`~raco_cli.methods.training.Checkpoints`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import TabularData
from raco_cli.methods.base import MethodSpec, Reporter, Seeds, TrainResult
from raco_cli.methods.gradients import (
    LinearEngine,
    engine_for,
    loss_of,
    resolve_precision,
    row_softmax,
)
from raco_cli.methods.timing import StepClock
from raco_cli.methods.training import EVAL_CHUNK, Checkpoints, Rows, initialize, make_optimizer
from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import (
    gaussian_noise,
    laplace_noise,
    noise_source,
    poisson_sample,
    sampling_generator,
)


@dataclass(frozen=True)
class CoreFlags:
    """Which stages of the step run.

    Attributes:
        private: clip per-sample gradients and add Gaussian noise.
        constrained: compute the histogram, the regularizer and the dual step.
        hist_noise: add Laplace noise to the histogram.
    """

    private: bool
    constrained: bool
    hist_noise: bool


def run(
    data: TabularData,
    model: nn.Module,
    constraints: ConstraintSet,
    spec: MethodSpec,
    *,
    flags: CoreFlags,
    steps: int,
    seeds: Seeds,
    device: torch.device,
    reporter: Reporter,
) -> TrainResult:
    """Train ``model`` for ``steps`` steps; see the module docstring for one step.  The
    methods' ``fit`` call it through :func:`raco_cli.methods.sgda.batched.run_one`, which trains
    logistic regression on the CPU on the batched engine instead."""
    if flags.private and (spec.clip_norm is None or spec.noise_multiplier is None):
        raise ValueError("a private run needs clip_norm and noise_multiplier")
    if flags.hist_noise and spec.hist_noise_multiplier is None:
        raise ValueError("histogram noise needs hist_noise_multiplier")
    constrained = flags.constrained and not constraints.is_empty
    train_idx = np.asarray(data.splits["train"])
    n = len(train_idx)
    size = spec.size_of(n)  # |D|: exact (scope=paper) or the released DP count (privacy/size.py)
    q = min(1.0, spec.batch_size / size)
    expected_batch = q * size  # q|D|: the normaliser of the noisy sum (Algorithm 1, line 8)
    initialize(model, seeds.init)
    model.to(device)
    engine = engine_for(
        model,
        micro_batch=spec.micro_batch,
        amp_dtype=resolve_precision(spec.precision, device),
        eval_chunk=min(EVAL_CHUNK, 4 * spec.micro_batch),
        loss=loss_of(data.task),
    )
    labels = not isinstance(engine, LinearEngine)
    rows = Rows(
        data, train_idx, constraints.cells(data.y[train_idx], data.group[train_idx]), device, pack=not labels,
        n_cells=constraints.Q if constrained else 0,
    )
    ops = constraints.to_torch(device)

    optimizer = make_optimizer(engine.params, spec)
    # Sampling draws O(qn) geometric gaps on the host (the indices are needed there anyway
    # to read lazy image stores), so a seed gives the same batches on every device; the
    # noise generator lives on the training device, where the noise is added.
    g_sample = sampling_generator(seeds.sampling, secure=spec.secure_rng)
    g_noise = noise_source(seeds.noise, device, secure=spec.secure_rng)
    # optional release hook (raco audit, tests): sees every noisy release as it happens,
    # ``on_release(step, kind, value)`` with kind "histogram" (Q, K) or "gradient" (per parameter)
    on_release = getattr(reporter, "on_release", None)
    independent = constrained and spec.sampling == "independent"
    clip = spec.clip_norm  # private runs always clip; non-private ones only when asked (Fig. 8a)
    noise_std = spec.required("noise_multiplier") * spec.required("clip_norm") if flags.private else 0.0

    lam = torch.zeros(constraints.J, dtype=torch.float64, device=device)
    checkpoints = Checkpoints(engine, model, data, constraints, spec, device=device, reporter=reporter, selection_seed=seeds.selection,
                              steps=steps)
    zero = torch.zeros((), device=device)
    clipped, norm_sum, nonfinite, batch_sum = zero.long(), zero, zero.long(), 0
    clock = StepClock()
    counts = {"laplace_histogram": 0, "gaussian_gradient": 0}  # releases per kind (contract tests)

    # feasibility from the noisy histograms (post-processing): Gamma_post(H) - gamma summed
    # over the steps since the previous evaluation
    violation_sum: Any = None  # (J,): numpy on the CPU, a tensor on an accelerator
    violation_steps = 0

    def record(step: int) -> None:
        nonlocal violation_sum, violation_steps
        window = (violation_sum, violation_steps) if flags.hist_noise and violation_sum is not None else None
        checkpoints.record(step, [float(v) for v in lam.cpu()], window=window)
        violation_sum, violation_steps = None, 0

    record(0)
    for t in range(1, steps + 1):
        t0 = time.perf_counter()
        samples = poisson_sample(n, q, g_sample, device, count=2 if independent else 1)
        batch = samples[-1]
        gathered, stacked = rows.batches(samples, labels=labels)  # [hist batch,] gradient batch
        b = gathered[-1] if len(batch) else None
        c_rows, g_dual, logits, soft_g = None, None, None, None
        if constrained:
            # independent: the histogram's own Poisson sample; shared: the gradient batch.
            # Packed (linear) rows: one forward pass over both batches serves the histogram
            # and the gradient; otherwise the histogram gets its own forward pass.
            # softmax(tau z) of packed rows is computed once (soft_all): the histogram's rates
            # and the regularizer of the gradient batch read the same values
            nh = len(samples[0])
            soft_h = None
            with torch.no_grad():
                if stacked is not None and len(stacked):
                    z_all = engine.logits(stacked)
                    soft_all = row_softmax(z_all, spec.temperature) if spec.dual != "hard" else None
                    z_h, logits = (z_all[:nh], z_all[nh:]) if independent else (z_all, z_all)
                    if soft_all is not None:
                        soft_h, soft_g = (soft_all[:nh], soft_all[nh:]) if independent else (soft_all, soft_all)
                else:
                    z_h = engine.logits(gathered[0]["X"]) if nh else None
                    logits = None if independent else z_h
            H = _histogram(z_h, rows.cell_rows(gathered[0], samples[0]), constraints.Q, constraints.K, spec, device, soft=soft_h)
            if flags.hist_noise:  # paper eq. 9: i.i.d. Laplace on every cell
                scale = spec.required("hist_noise_multiplier")
                H = releases.release("histogram", lambda H=H, scale=scale: H + laplace_noise(tuple(H.shape), scale, g_noise).to(device))  # type: ignore[misc]
                counts["laplace_histogram"] += 1
            if on_release is not None:  # before the update: theta_{t-1} produced this histogram
                on_release(t, "histogram", H)
            # on the CPU numpy arrays: the (J,) bookkeeping and the weights stay in numpy (~1 us an op instead of ~5)
            weights, g_dual = ops.step(H, lam, floor=spec.denominator_floor)
            violation_sum = (g_dual.copy() if isinstance(g_dual, np.ndarray) else g_dual.clone()) if violation_sum is None else violation_sum + g_dual
            violation_steps += 1
            if b is not None:
                cells_b = rows.cell_rows(b, batch)
                if isinstance(weights, np.ndarray):  # the CPU
                    w = weights.astype(np.float32)
                    c_rows = torch.from_numpy(cells_b.numpy() @ w) if cells_b.dim() == 2 else torch.from_numpy(w[cells_b.numpy()])
                else:
                    w = weights.float()
                    c_rows = cells_b @ w if cells_b.dim() == 2 else w.index_select(0, cells_b)
        if b is not None:
            res = engine.clipped_sum(
                **{k: v for k, v in b.items() if k != "cellhot"}, c=c_rows, reg_scale=expected_batch, temperature=spec.temperature, clip_norm=clip, logits=logits,
                probs=soft_g,
            )
            grads = res.grads
            clipped, norm_sum, nonfinite = clipped + res.clipped, norm_sum + res.norm_sum, nonfinite + res.nonfinite
        else:  # an empty Poisson batch: the noisy sum is pure noise
            grads = [torch.zeros_like(p) for p in engine.params]
        if flags.private:  # Algorithm 1, line 9: N(0, (sigma C)^2) on the clipped sum
            counts["gaussian_gradient"] += 1
            grads = releases.release(
                "gradient", lambda sums=grads: [g + gaussian_noise(tuple(g.shape), noise_std, g_noise, dtype=g.dtype) for g in sums]  # type: ignore[misc]
            )
            if on_release is not None:  # the noisy sum, before the update (raco audit's gradient canaries)
                on_release(t, "gradient", grads)
        optimizer.step(grads, scale=1.0 / expected_batch)
        if g_dual is not None:  # paper eq. 12 and line 13: projected dual ascent
            lam = dual_ascent(lam, g_dual, spec.lr_dual, spec.lambda_max)
        evaluate_now = t % spec.eval_every == 0 or t == steps
        if evaluate_now and device.type == "cuda":  # queued kernels belong to the steps' time
            torch.cuda.synchronize(device)
        clock.add(time.perf_counter() - t0)
        batch_sum += len(batch)
        reporter.on_step(t, steps, {"batch": float(len(batch))})
        if evaluate_now:
            record(t)

    history, selected, state = checkpoints.finish()
    T = max(steps, 1)
    return TrainResult(
        history=history,
        selected=selected,
        steps=steps,
        lam=[float(v) for v in lam.cpu()],
        state_dict=state,
        stats={
            "mean_batch_size": batch_sum / T,
            "clip_fraction": float(clipped) / max(batch_sum, 1),
            "mean_grad_norm": float(norm_sum) / max(batch_sum, 1),
            "nonfinite_rows": float(nonfinite),
            "time_per_step_ms": clock.steady_ms,  # first (warm-up) step excluded
            "first_step_ms": clock.first_ms,
            # training examples (gradient-batch rows) per second of step time, evaluation excluded
            "throughput_images_per_s": batch_sum / clock.total_s if clock.total_s > 0 else 0.0,
            "sample_rate": q,
        },
        releases=counts,
    )


def dual_ascent(lam: torch.Tensor, g_dual: Any, lr_dual: float, lambda_max: float) -> torch.Tensor:
    """``project_dual(lam + lr_dual * g_dual)``; on the CPU in numpy on shared memory (the
    same float64 arithmetic, a fraction of torch's per-op dispatch)."""
    if isinstance(g_dual, np.ndarray):  # np.minimum/np.maximum: clip's values without its ~5 us of Python
        return torch.from_numpy(np.minimum(np.maximum(lam.numpy() + lr_dual * g_dual, 0.0), lambda_max))
    return project_dual(lam + lr_dual * g_dual, lambda_max)


def project_dual(lam: torch.Tensor, lambda_max: float) -> torch.Tensor:
    """Euclidean projection onto Lambda = [0, lambda_max]^J (a box: coordinate-wise clip).

    >>> project_dual(torch.tensor([-1.0, 0.5, 12.0]), 10.0).tolist()
    [0.0, 0.5, 10.0]
    """
    return lam.clamp(min=0.0, max=lambda_max)


@torch.no_grad()
def _histogram(logits: torch.Tensor | None, cells: torch.Tensor, Q: int, K: int, spec: MethodSpec, device: torch.device, *,
               soft: torch.Tensor | None = None) -> torch.Tensor:
    """Exact histogram H (Q, K), float64, of a batch's logits (paper eq. 8).

    ``cells``: the rows' global cells, as indices (n,) or one-hot (n, Q); ``soft``: the
    rows' ``softmax(tau * logits)`` when already computed (soft rates only).

    Soft rates ``softmax(tau z)``, or arg-max one-hots for ``dual=hard``; each row adds a
    probability vector (l1 norm 1) to its own cell, so the l1 sensitivity is 1.  A row with
    non-finite logits (overflowing model) would add NaN and poison every later step through
    the denominators and lambda; its NaN entries count 0 instead (its vector keeps l1 <= 1,
    so the sensitivity bound still holds; the gradient engines drop and count such rows).
    """
    if logits is None:
        return torch.zeros(Q, K, dtype=torch.float64, device=device)
    if spec.dual == "hard":
        probs = nn.functional.one_hot(logits.argmax(dim=1), K).to(logits.dtype)
    else:
        probs = row_softmax(logits, spec.temperature) if soft is None else soft
    if cells.dim() == 2 and cells.device.type == "cpu":  # one-hot cells (n, Q): H = C^T P, in numpy (~3-5 us against torch's ~15-20)
        C, P = cells.numpy(), probs.numpy()
        H = C.T @ P
        # a non-finite entry of P makes its column of H non-finite (0 * NaN is NaN), so a
        # finite H is the product with P's non-finite entries zeroed: the check replaces
        # nan_to_num on every row
        if not np.isfinite(H).all():
            H = C.T @ np.nan_to_num(P, nan=0.0, posinf=0.0, neginf=0.0)
        return torch.from_numpy(H.astype(np.float64))
    probs = torch.nan_to_num(probs, nan=0.0, posinf=0.0, neginf=0.0)  # (arg-max one-hots are finite already)
    if cells.dim() == 2:
        return (cells.t() @ probs).double()
    return torch.zeros(Q, K, dtype=probs.dtype, device=device).index_add_(0, cells, probs).double()
