"""The SGDA loop (:func:`raco_cli.methods.sgda.core.run`) of a sweep group's R runs at once, on
the batched engine (:mod:`raco_cli.methods.batched`): what ``fit_many`` of raco_dp, dp_sgd, sgd
and sgda runs, and (:func:`run_one`) their ``fit`` of logistic regression on the CPU, a run
alone as a group of one.  A run computes the same numbers alone and in any group
(docs/batched.md, "One path").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import TabularData
from raco_cli.methods.base import MethodSpec, Reporter, Seeds, TrainResult
from raco_cli.methods.batched import (
    GroupCheckpoints,
    GroupOptimizer,
    Member,
    check_group,
    clipped_sums,
    compiled_scan_applies,
    gaussian_many,
    group_logits,
    group_onehots,
    group_softmax,
    initial_parameters,
    laplace_many,
    noise_sources,
    per_run,
    report_step,
    run_stats,
    trains_alone_here,
)
from raco_cli.methods.group_rows import GroupRows
from raco_cli.methods.sgda import core
from raco_cli.methods.timing import StepClock
from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import (
    poisson_sample_many,
    sampling_generator,
)


def _windows(violation_sum: np.ndarray | None, count: np.ndarray) -> list[tuple[Any, int] | None]:
    """Each run's window of noisy dual gradients since its last evaluation (None: no step)."""
    if violation_sum is None:
        return [None] * len(count)
    return [(violation_sum[r].copy(), int(c)) if c else None for r, c in enumerate(count)]


def run_one(data: TabularData, model: torch.nn.Module, constraints: ConstraintSet, spec: MethodSpec, *, flags: core.CoreFlags,
            steps: int, seeds: Seeds, device: torch.device, reporter: Reporter) -> TrainResult:
    """One run of the SGDA loop: logistic regression on in-memory rows on the CPU trains as a
    group of one on the batched engine (:func:`run_core`), so its numbers are those of the same
    run in any sweep group (one path: docs/batched.md); any other model or device takes the
    one-run loop (:func:`raco_cli.methods.sgda.core.run`)."""
    if trains_alone_here(data, model, device):
        member = Member(model=model, constraints=constraints, spec=spec, seeds=seeds, reporter=reporter)
        return run_core(data, [member], flags=flags, steps=steps, device=device)[0]
    return core.run(data, model, constraints, spec, flags=flags, steps=steps, seeds=seeds, device=device, reporter=reporter)


def run_core(
    data: TabularData,
    members: Sequence[Member],
    *,
    flags: core.CoreFlags,
    steps: int | Sequence[int],
    device: torch.device,
    reporter: Reporter | None = None,
) -> list[TrainResult]:
    """:func:`raco_cli.methods.sgda.core.run` of R runs at once; one :class:`TrainResult` per run.

    ``steps``: every run's T, or one per run (a scope=model sweep's seeds plan nearly the same
    T from their own released n~): the group steps to the largest; a run whose T is reached
    stops there, as alone: it records nothing more (its checkpoints are copies) and its
    multipliers and counters stay as at its T (what its result reports); the group's products
    go on computing its rows, which nothing reads.  ``reporter`` (optional) gets the group's steps (a
    progress bar); each member's reporter gets its evaluations, and a step report at every
    evaluation (heartbeats).
    """
    check_group(members)
    specs = [m.spec for m in members]
    spec0, cons0, R = specs[0], members[0].constraints, len(members)
    T = np.broadcast_to(np.asarray(steps, dtype=np.int64), (R,)).copy()  # each run's own T
    last = int(T.max()) if R else 0
    for s in specs:
        if flags.private and (s.clip_norm is None or s.noise_multiplier is None):
            raise ValueError("a private run needs clip_norm and noise_multiplier")
        if flags.hist_noise and s.hist_noise_multiplier is None:
            raise ValueError("histogram noise needs hist_noise_multiplier")
    constrained = flags.constrained and not cons0.is_empty
    train_idx = np.asarray(data.splits["train"])
    n = len(train_idx)
    # each run's rate from its own public training size (exact, or its released DP count)
    q = np.array([min(1.0, m.spec.batch_size / m.spec.size_of(n)) for m in members])
    expected_batch = q * np.array([m.spec.size_of(n) for m in members])
    W, b, layers = initial_parameters(members, device)
    rows = GroupRows(data, train_idx, cons0.cells(data.y[train_idx], data.group[train_idx]), [m.scaling for m in members], device,
                     n_cells=cons0.Q if constrained else 0)
    membership, alpha = cons0.membership, cons0.alpha
    gamma = np.stack([m.constraints.gamma for m in members])  # (R, J)
    optimizer = GroupOptimizer(specs, device)
    g_sample = [sampling_generator(m.seeds.sampling, secure=m.spec.secure_rng) for m in members]
    g_noise = noise_sources(members, device)
    independent = constrained and spec0.sampling == "independent"
    clip = per_run([s.clip_norm for s in specs], device, dims=2) if spec0.clip_norm is not None else None  # type: ignore[misc]
    noise_std = [s.required("noise_multiplier") * s.required("clip_norm") for s in specs] if flags.private else []
    hist_scale = [s.required("hist_noise_multiplier") for s in specs] if flags.hist_noise and constrained else []
    temps = [s.temperature for s in specs]
    temperature = None if all(t == 1.0 for t in temps) else per_run(temps, device)
    reg_temp = per_run([e * t for e, t in zip(expected_batch, temps)], device)
    hard = spec0.dual == "hard"
    lr_dual = np.array([s.lr_dual for s in specs])[:, None]
    lambda_max = np.array([s.lambda_max for s in specs])[:, None]
    floors = np.array([s.denominator_floor for s in specs], dtype=np.float64)

    # the step's data pass compiled, the table read in row order (methods/batched_scan.py):
    # every run on the CPU, alone or grouped; torch's gather and products on an accelerator
    from raco_cli.methods.batched_scan import dual_step

    scan = None
    if compiled_scan_applies(device):
        from raco_cli.methods.batched_scan import Scan

        scan = Scan(rows, R)
        temps_np = np.array(temps, dtype=np.float32)
        reg_temp_np = reg_temp.reshape(R).numpy()
        clip_np = clip.reshape(R).numpy() if clip is not None else None

    lam = np.zeros((R, cons0.J))
    # optional release hooks (raco audit, tests), as in the one-run loop: run r's
    # ``on_release(step, kind, value)`` sees its histogram (Q, K) and its noisy gradient sums
    hooks = [(r, hook) for r, m in enumerate(members) if (hook := getattr(m.reporter, "on_release", None)) is not None]
    checkpoints = GroupCheckpoints(data, members, layers, device, steps=T.tolist())
    clipped, nonfinite = np.zeros(R, dtype=np.int64), np.zeros(R, dtype=np.int64)
    norm_sum = np.zeros(R, dtype=np.float32)  # (float32 sums, as the one-run loop kept them)
    batch_sum = np.zeros(R, dtype=np.int64)
    clock = StepClock()
    counts = {"laplace_histogram": np.zeros(R, dtype=np.int64), "gaussian_gradient": np.zeros(R, dtype=np.int64)}  # per run
    violation_sum: np.ndarray | None = None  # (R, J)
    violation_steps = np.zeros(R, dtype=np.int64)  # each run's steps since its last evaluation

    def record(step: int, due: np.ndarray) -> None:
        windows = _windows(violation_sum if flags.hist_noise else None, violation_steps)
        checkpoints.record(step, W, b, lam, windows, due=due)
        if violation_sum is not None:
            violation_sum[due] = 0.0
        violation_steps[due] = 0

    record(0, np.ones(R, dtype=bool))
    for t in range(1, last + 1):
        t0 = time.perf_counter()
        active = T >= t  # the runs still training (all but in a group's last few steps when T differ)
        count = 2 if independent else 1  # [hist sample,] gradient sample
        c, g_dual, z, weights = None, None, None, None
        if scan is not None:  # the samples read as drawn, never cut into padded index blocks
            lengths = scan.sample(scan.positions(q, g_sample, count=count), count=count, shared=constrained and not independent)
        else:
            idx, lengths = poisson_sample_many(n, q, g_sample, count=count)
            L = idx.shape[2]
            batch = rows.gather(idx.reshape(R, -1))  # [hist block,] gradient block
            grad_rows = {k: v[:, -L:] for k, v in batch.items()}
        if constrained:
            if scan is not None:
                H = scan.histograms(W, b, temps_np, hard=hard)
            else:
                with torch.no_grad():
                    z_all = group_logits(W, b, batch["X"])
                z_h, z = z_all[:, :, :L], z_all[:, :, -L:]
                H = _histograms(z_h, batch["cellhot"][:, :L], hard=hard, temperature=temperature)
            if flags.hist_noise:  # paper eq. 9: i.i.d. Laplace on every cell of every run's histogram
                H = releases.release("histogram", lambda H=H: H + laplace_many(tuple(H.shape[1:]), hist_scale, g_noise).to(device))  # type: ignore[misc]
                counts["laplace_histogram"] += active
            for r, hook in hooks:  # before the update: theta_{t-1} produced this histogram
                if active[r]:
                    hook(t, "histogram", H[r])
            weights, g_dual = dual_step(membership, alpha, H.cpu().numpy(), lam, floors, gamma)
            violation_sum = g_dual.copy() if violation_sum is None else violation_sum + g_dual
            violation_steps += 1
            if scan is None:
                c = torch.bmm(torch.as_tensor(weights, device=device).float().transpose(1, 2), grad_rows["cellhot"].transpose(1, 2))
        elif scan is not None:
            scan.logits(W, b)
        else:
            with torch.no_grad():
                z = group_logits(W, b, grad_rows["X"])
        if scan is not None:
            res = scan.clipped_sums(weights, reg_temp_np, temps_np, clip_np)
        else:
            assert z is not None  # (set by the torch branches above)
            res = clipped_sums(grad_rows, z, c, reg_temp=reg_temp, temperature=temperature, clip=clip)
        clipped += np.where(active, res.clipped.cpu().numpy(), 0)
        norm_sum += np.where(active, res.norm_sum.cpu().numpy(), 0.0)
        nonfinite += np.where(active, res.nonfinite.cpu().numpy(), 0)
        grads = [res.grad_w, res.grad_b]
        if flags.private:  # Algorithm 1, line 9, per run: its weight noise, then its bias noise
            counts["gaussian_gradient"] += active
            grads = releases.release(
                "gradient",
                lambda gw=res.grad_w, gb=res.grad_b: [gw + gaussian_many(tuple(gw.shape[1:]), noise_std, g_noise, dtype=gw.dtype),  # type: ignore[misc]
                                                      gb + gaussian_many(tuple(gb.shape[1:]), noise_std, g_noise, dtype=gb.dtype)],
            )
            for r, hook in hooks:  # the noisy sums, before the update (raco audit's gradient canaries)
                if active[r]:
                    hook(t, "gradient", [grads[0][r], grads[1][r]])
        optimizer.step([W, b], grads, scale=1.0 / expected_batch)
        if g_dual is not None:  # paper eq. 12 and line 13, per run
            lam = np.where(active[:, None], np.minimum(np.maximum(lam + lr_dual * g_dual, 0.0), lambda_max), lam)  # (clip's values, without its overhead)
        due = active & ((t % spec0.eval_every == 0) | (T == t))  # each run's evaluations, its last step's included
        evaluate_now = bool(due.any())
        if evaluate_now and device.type == "cuda":
            torch.cuda.synchronize(device)
        clock.add(time.perf_counter() - t0)
        batch_sum += lengths[:, -1] * active
        report_step(reporter, members, t, last, evaluate=evaluate_now, batch=lengths[:, -1])
        if evaluate_now:
            record(t, due)

    finished = checkpoints.finish()
    return [
        TrainResult(
            history=history, selected=selected, steps=int(T[r]), lam=[float(v) for v in lam[r]], state_dict=state,
            stats=run_stats(r, steps=int(T[r]), rows=batch_sum, clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite, clock=clock,
                            sample_rate=float(q[r])),
            releases={kind: int(c[r]) for kind, c in counts.items()},
        )
        for r, (history, selected, state) in enumerate(finished)
    ]


@torch.no_grad()
def _histograms(z: torch.Tensor, cellhot: torch.Tensor, *, hard: bool, temperature: torch.Tensor | None) -> torch.Tensor:
    """Exact histograms (R, Q, K) float64 of each run's batch (class-major logits z (R, K, L),
    cells (R, L, Q); paper eq. 8), as
    :func:`raco_cli.methods.sgda.core._histogram` (pad slots have no cell)."""
    if hard:
        probs = group_onehots(z)
    else:
        probs = torch.nan_to_num(group_softmax(z, temperature), nan=0.0, posinf=0.0, neginf=0.0)
    return torch.bmm(probs, cellhot).transpose(1, 2).double()
