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
follows :func:`select_checkpoint`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import SPLITS, TabularData
from raco_cli.methods.base import (
    EvalRecord,
    MethodSpec,
    Reporter,
    Seeds,
    TrainResult,
    select_checkpoint,
)
from raco_cli.methods.gradients import (
    LinearEngine,
    engine_for,
    loss_of,
    resolve_precision,
    row_softmax,
)
from raco_cli.methods.timing import StepClock
from raco_cli.metrics.evaluate import evaluate, evaluate_regression
from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import (
    gaussian_noise,
    laplace_noise,
    noise_source,
    poisson_sample,
    sampling_generator,
)
from raco_cli.privacy.selection import NoisyArgmax

log = logging.getLogger(__name__)

EVAL_CHUNK = 8192
EVAL_CHUNK_BYTES = 2**27  # 128 MiB of features per evaluation chunk


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


class Rows:
    """Training rows on the device (in-memory arrays) or fetched per batch (lazy stores).

    ``pack`` (the closed-form linear engine): features flattened to (n, d), one-hot labels
    and the norms ``sqrt(|x|^2 + 1)`` are packed into one matrix once, so a step gathers a
    batch with a single ``index_select``.  Otherwise in-memory features keep their example
    shape (``(n, C, H, W)`` for images) and lazy stores (e.g. CelebA on disk) are read per
    batch with ``data.rows(idx)`` and moved to the device (through pinned memory on CUDA).
    """

    def __init__(
        self, data: TabularData, idx: np.ndarray, cells: np.ndarray, device: torch.device, *, pack: bool = True, n_cells: int = 0
    ) -> None:
        self.data, self.idx, self.device = data, idx, device
        self.eager = isinstance(data.X, np.ndarray)
        self.pack = self.eager and pack
        # task=regression: the real-valued target takes the place of the labels (and of their
        # one-hot columns when packed)
        self.regression = data.target is not None
        if data.target is not None:
            self.y = torch.as_tensor(data.target[idx], dtype=torch.float32, device=device)
        else:
            self.y = torch.as_tensor(data.y[idx], dtype=torch.long, device=device)
        self.cells = torch.as_tensor(cells, dtype=torch.long, device=device)
        if self.pack:
            X = torch.as_tensor(np.asarray(data.X[idx]).reshape(len(idx), -1), dtype=torch.float32, device=device)
            onehot = self.y[:, None] if self.regression else nn.functional.one_hot(self.y, data.n_classes).float()
            # rows with a non-finite feature are neutralised once, here: zero features, an
            # infinite norm (the engines drop and count rows with a non-finite norm) and no
            # cell (no histogram contribution); a step then never touches NaN/inf
            bad = ~torch.isfinite(X).all(dim=1, keepdim=True)
            X = torch.where(bad, torch.zeros_like(X), X)
            xnorm = torch.where(bad, torch.full_like(X[:, :1], float("inf")), torch.sqrt((X * X).sum(dim=1, keepdim=True) + 1.0))
            # one-hot global cells: histograms and regularizer weights become matrix products
            cellhot = nn.functional.one_hot(self.cells, n_cells).float() * ~bad if n_cells else X[:, :0]
            self.packed = torch.cat([X, onehot, xnorm, cellhot], dim=1)
            self.d, self.K, self.Q = X.shape[1], data.n_classes, n_cells
            # on the CPU numpy's take gathers rows about 1.5-2x faster than index_select
            self._packed_np = self.packed.numpy() if self.packed.device.type == "cpu" else None
        elif self.eager:
            self.X = torch.as_tensor(np.asarray(data.X[idx]), dtype=torch.float32, device=device)

    def features(self, b: torch.Tensor) -> torch.Tensor:
        if self.pack:
            return self._gather(b)[:, : self.d]
        if self.eager:
            return self.X.index_select(0, b)
        return to_device(self.data.rows(self.idx[b.cpu().numpy()]), self.device)

    def batch(self, b: torch.Tensor, *, labels: bool) -> dict[str, torch.Tensor]:
        """Engine keyword arguments of a batch (``labels``: include the int labels ``y``)."""
        out: dict[str, torch.Tensor] = {}
        if self.pack:
            return self._split(self._gather(b), b, labels=labels)
        out["X"] = self.features(b)
        out["y"] = self.y.index_select(0, b)
        return out

    def batches(self, idx: list[torch.Tensor], *, labels: bool) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor | None]:
        """:meth:`batch` of several index sets, and (packed rows only) the features of all of
        them stacked, gathered in one pass so one forward pass can serve every batch."""
        if not self.pack:
            return [self.batch(b, labels=labels) for b in idx], None
        P = self._gather(torch.cat(idx)) if len(idx) > 1 else self._gather(idx[0])
        out, start = [], 0
        for b in idx:
            out.append(self._split(P[start : start + len(b)], b, labels=labels))
            start += len(b)
        return out, P[:, : self.d]

    def _gather(self, b: torch.Tensor) -> torch.Tensor:
        if self._packed_np is not None:
            return torch.from_numpy(np.take(self._packed_np, b.numpy(), axis=0))
        return self.packed.index_select(0, b)

    def _split(self, P: torch.Tensor, b: torch.Tensor, *, labels: bool) -> dict[str, torch.Tensor]:
        d, K, Q = self.d, self.K, self.Q
        out = {"X": P[:, :d], "xnorm": P[:, d + K]}
        if self.regression:
            out["target"] = P[:, d]
        else:
            out["onehot"] = P[:, d : d + K]
        if Q:
            out["cellhot"] = P[:, d + K + 1 : d + K + 1 + Q]
        if labels:
            out["y"] = self.y.index_select(0, b)
        return out

    def cell_rows(self, batch: dict[str, torch.Tensor], b: torch.Tensor) -> torch.Tensor:
        """The global cells of a batch: one-hot (n, Q) float when packed, else indices (n,)."""
        return batch["cellhot"] if "cellhot" in batch else self.cells.index_select(0, b)


def to_device(rows: np.ndarray, device: torch.device) -> torch.Tensor:
    """float32 tensor of host rows on ``device`` (pinned, asynchronous copy on CUDA)."""
    t = torch.as_tensor(np.asarray(rows), dtype=torch.float32)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def initialize(model: nn.Module, seed: int) -> None:
    """Re-initialise every parameter from ``seed`` (the run is then independent of how and
    when the model was built), without touching the global RNG stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in model.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class _Optimizer:
    """Primal update from a (noisy) gradient: plain SGD in place, or a torch optimizer.

    Momentum and Adam only post-process the privatised gradient, so they cost no privacy.
    """

    def __init__(self, params: list[nn.Parameter], spec: MethodSpec) -> None:
        self.params, self.lr = params, spec.lr
        self.torch_opt: torch.optim.Optimizer | None = None
        if spec.optimizer == "adam":
            self.torch_opt = torch.optim.Adam(params, lr=spec.lr)
        elif spec.optimizer == "momentum":
            self.torch_opt = torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum)

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], *, scale: float) -> None:
        if self.torch_opt is None:
            for p, g in zip(self.params, grads):
                p.add_(g, alpha=-self.lr * scale)
            return
        for p, g in zip(self.params, grads):
            p.grad = g * scale
        self.torch_opt.step()


def make_optimizer(params: list[nn.Parameter], spec: MethodSpec) -> _Optimizer:
    return _Optimizer(params, spec)


@torch.no_grad()
def predict_logits(engine, data: TabularData, idx: np.ndarray, device: torch.device) -> np.ndarray:
    """Exact logits of the given rows, in chunks of at most ``EVAL_CHUNK`` rows,
    ``EVAL_CHUNK_BYTES`` of float32 features (images: 8192 x 3 x 128 x 128 would be 1.6 GB)
    and the engine's ``eval_chunk`` (bounded activation memory of conv nets)."""
    out = []
    row_bytes = 4 * max(1, int(np.prod(data.input_shape)))
    chunk = max(1, min(EVAL_CHUNK, EVAL_CHUNK_BYTES // row_bytes, int(getattr(engine, "eval_chunk", EVAL_CHUNK))))
    for start in range(0, len(idx), chunk):
        rows = idx[start : start + chunk]
        X = to_device(data.rows(rows), device)
        out.append(engine.logits(X).double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, data.n_classes))


def evaluate_all(engine, data: TabularData, constraints: ConstraintSet, *, temperature: float, device: torch.device,
                 robust: bool = False) -> dict:
    """Metrics of every split (non-private: model selection is not accounted, as in the paper);
    ``robust``: with ROC AUC (the DRO runs, :mod:`raco_cli.metrics.robust`)."""
    out = {}
    for split in SPLITS:
        idx = np.asarray(data.splits[split])
        logits = predict_logits(engine, data, idx, device)
        if data.target is not None:  # task=regression: mean squared prediction errors
            out[split] = evaluate_regression(logits, data.target[idx], data.group[idx], group_names=data.group_names)
            continue
        out[split] = evaluate(
            logits,
            data.y[idx],
            data.group[idx],
            constraints=constraints,
            temperature=temperature,
            group_names=data.group_names,
            class_names=data.class_names,
            robust=robust,
        )
    return out


class Checkpoints:
    """Evaluations, checkpoint candidates and the selection rule, shared by every method.

    ``record(step, lam)`` evaluates the model exactly on train/val/test, reports the
    record and keeps only the states that can still be selected (the current best and the
    last); ``finish()`` loads the selected state into the model and returns
    ``(history, selected, state_dict)``.

    ``spec.scope == "model"`` (``privacy.scope``): a record holds only the test metrics (the
    held-out evaluation) and ``release`` (feasibility read from the noisy histograms,
    ``noisy_violation`` and ``satisfied``; None when the method releases none).  Exact train
    and validation statistics never leave this class: ``best_feasible`` then selects by
    report-noisy-max on validation correct counts (:mod:`raco_cli.privacy.selection`), its
    noisy scores being releases.
    """

    def __init__(
        self,
        engine,
        model: nn.Module,
        data: TabularData,
        constraints: ConstraintSet,
        spec: MethodSpec,
        *,
        device: torch.device,
        reporter: Reporter,
        selection_seed: int = 0,
    ) -> None:
        self.engine, self.model, self.data, self.constraints = engine, model, data, constraints
        self.spec, self.device, self.reporter = spec, device, reporter
        self.history: list[EvalRecord] = []
        self.states: dict[int, dict] = {}
        self.model_scope = spec.scope == "model"
        self._pending: int | None = None  # scope=model: the candidate whose feasibility is not settled
        self._score = 0.0  # its noisy selection score
        self._pending_window: tuple[Any, int] | None = None
        self.noisy_max: NoisyArgmax | None = None
        if self.model_scope and spec.selection == "best_feasible":
            if not spec.selection_eps > 0:
                raise ValueError("scope=model with selection=best_feasible needs selection_eps > 0")
            self.noisy_max = NoisyArgmax(spec.selection_eps, noise_source(selection_seed, "cpu", secure=spec.secure_rng))

    def record(
        self, step: int, lam: list[float], *, window: tuple[Any, int] | None = None, metrics: dict[str, Any] | None = None,
        extra: dict[str, dict[str, Any]] | None = None,
    ) -> EvalRecord:
        """Evaluate and keep a candidate.

        ``metrics``: the evaluation, when the caller computed it (batched training evaluates
        every run of a group at once); by default the model is evaluated here.

        ``window`` (scope=model): the sum over the steps since the previous evaluation of the
        noisy dual gradients ``Gamma_post(H) - gamma`` (J,) and their number (None when the
        method releases no histogram).  A candidate's feasibility is read from the steps
        around it, the window before it and the window after it (the next evaluation's),
        averaged: ``max_j mean(Gamma_post - gamma_j) <= 0``.  The parameters oscillate under
        the dual dynamics, so a window centred on the checkpoint estimates its rates better
        than the histograms of earlier parameters alone; all of it is post-processing.

        ``extra``: a method's own evaluations by split (e.g. the DRO gradient norm), merged
        into the metrics before the scope filter (scope=model keeps only ``test``).
        """
        if metrics is None:
            metrics = evaluate_all(self.engine, self.data, self.constraints, temperature=self.spec.temperature, device=self.device,
                                   robust=self.spec.objective.is_dro)
        for key, values in (extra or {}).items():
            metrics[key] = {**metrics.get(key, {}), **values}
        index = len(self.history)
        if self.model_scope:
            if self._pending is not None:  # its window after is this one's window before
                self._pending_window = _add_windows(self._pending_window, window)
                self.history[self._pending].metrics["release"] = _feasibility(self._pending_window)
            self._settle()
            if self.noisy_max is not None:
                val = metrics["val"]
                correct = float(round(val["accuracy"] * val["n"])) if val["n"] else 0.0
                noisy_max = self.noisy_max
                self._score = releases.release("selection_score", lambda: noisy_max.noisy_score(correct))
            metrics = {"test": metrics["test"], "release": _feasibility(window)}
        self.history.append(EvalRecord(step=step, metrics=metrics, lam=lam))
        self.states[index] = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        if self.model_scope:
            self._pending, self._pending_window = index, window
        else:
            self._prune()
            self.reporter.on_eval(self.history[-1])
        return self.history[-1]

    def _settle(self) -> None:
        if self._pending is None:
            return
        index, self._pending = self._pending, None
        if self.noisy_max is not None:
            self.noisy_max.offer(index, self._score, eligible=self.history[index].metrics["release"]["satisfied"] is not False)
        self._prune()
        self.reporter.on_eval(self.history[index])

    def _prune(self) -> None:
        """Keep only the states that can still be selected (the current best and the last)."""
        best, last = self.selected(), len(self.history) - 1
        for i in list(self.states):
            if i not in (best, last):
                del self.states[i]

    def selected(self) -> int:
        """Index of the checkpoint the rule reports, given the evaluations so far."""
        if not self.model_scope:
            return select_checkpoint(self.history, self.spec.selection)[0]
        if self.noisy_max is None or self.noisy_max.best is None:  # last, or nothing feasible
            return len(self.history) - 1
        return self.noisy_max.best

    def finish(self) -> tuple[list[EvalRecord], int, dict]:
        self._settle()
        selected = self.selected()
        self.model.load_state_dict(self.states[selected])
        return self.history, selected, self.states[selected]


def _feasibility(window: tuple[Any, int] | None) -> dict[str, Any]:
    """The ``release`` metrics of a checkpoint from a window of noisy dual gradients:
    ``max_j`` of their mean (the noisy max violation) and whether it is <= 0."""
    if window is None or window[1] == 0:
        return {"noisy_violation": None, "satisfied": None}
    violation = float((window[0] / window[1]).max())
    return {"noisy_violation": violation, "satisfied": violation <= 0.0}


def _add_windows(a: tuple[Any, int] | None, b: tuple[Any, int] | None) -> tuple[Any, int] | None:
    if a is None or b is None:
        return a if b is None else b
    return a[0] + b[0], a[1] + b[1]


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
    """Train ``model`` for ``steps`` steps; see the module docstring for one step."""
    if flags.private and (spec.clip_norm is None or spec.noise_multiplier is None):
        raise ValueError("a private run needs clip_norm and noise_multiplier")
    if flags.hist_noise and spec.hist_noise_multiplier is None:
        raise ValueError("histogram noise needs hist_noise_multiplier")
    constrained = flags.constrained and not constraints.is_empty
    train_idx = np.asarray(data.splits["train"])
    n = len(train_idx)
    q = min(1.0, spec.batch_size / n)
    expected_batch = q * n  # q|D|: the normaliser of the noisy sum (Algorithm 1, line 8)
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
    checkpoints = Checkpoints(engine, model, data, constraints, spec, device=device, reporter=reporter, selection_seed=seeds.selection)
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
        c_rows, g_dual, logits = None, None, None
        if constrained:
            # independent: the histogram's own Poisson sample; shared: the gradient batch.
            # Packed (linear) rows: one forward pass over both batches serves the histogram
            # and the gradient; otherwise the histogram gets its own forward pass.
            nh = len(samples[0])
            with torch.no_grad():
                if stacked is not None and len(stacked):
                    z_all = engine.logits(stacked)
                    z_h, logits = (z_all[:nh], z_all[nh:]) if independent else (z_all, z_all)
                else:
                    z_h = engine.logits(gathered[0]["X"]) if nh else None
                    logits = None if independent else z_h
            H = _histogram(z_h, rows.cell_rows(gathered[0], samples[0]), constraints.Q, constraints.K, spec, device)
            if flags.hist_noise:  # paper eq. 9: i.i.d. Laplace on every cell
                scale = spec.required("hist_noise_multiplier")
                H = releases.release("histogram", lambda H=H, scale=scale: H + laplace_noise(tuple(H.shape), scale, g_noise).to(device))  # type: ignore[misc]
                counts["laplace_histogram"] += 1
            if on_release is not None:  # before the update: theta_{t-1} produced this histogram
                on_release(t, "histogram", H)
            weights, g_dual = ops.step(H, lam, floor=spec.denominator_floor)
            if g_dual.device.type == "cpu":  # the (J,) bookkeeping in numpy: ~1 us an op instead of ~5
                g_dual = g_dual.numpy()
            violation_sum = (g_dual.copy() if isinstance(g_dual, np.ndarray) else g_dual.clone()) if violation_sum is None else violation_sum + g_dual
            violation_steps += 1
            if b is not None:
                cells_b = rows.cell_rows(b, batch)
                w = weights.float()
                c_rows = cells_b @ w if cells_b.dim() == 2 else w.index_select(0, cells_b)
        if b is not None:
            res = engine.clipped_sum(
                **{k: v for k, v in b.items() if k != "cellhot"}, c=c_rows, reg_scale=expected_batch, temperature=spec.temperature, clip_norm=clip, logits=logits
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
    if isinstance(g_dual, np.ndarray):
        return torch.from_numpy(np.clip(lam.numpy() + lr_dual * g_dual, 0.0, lambda_max))
    return project_dual(lam + lr_dual * g_dual, lambda_max)


def project_dual(lam: torch.Tensor, lambda_max: float) -> torch.Tensor:
    """Euclidean projection onto Lambda = [0, lambda_max]^J (a box: coordinate-wise clip).

    >>> project_dual(torch.tensor([-1.0, 0.5, 12.0]), 10.0).tolist()
    [0.0, 0.5, 10.0]
    """
    return lam.clamp(min=0.0, max=lambda_max)


@torch.no_grad()
def _histogram(logits: torch.Tensor | None, cells: torch.Tensor, Q: int, K: int, spec: MethodSpec, device: torch.device) -> torch.Tensor:
    """Exact histogram H (Q, K), float64, of a batch's logits (paper eq. 8).

    ``cells``: the rows' global cells, as indices (n,) or one-hot (n, Q).

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
        probs = torch.nan_to_num(row_softmax(logits, spec.temperature), nan=0.0, posinf=0.0, neginf=0.0)
    if cells.dim() == 2:  # one-hot cells (n, Q): H = C^T P
        return (cells.t() @ probs).double()
    return torch.zeros(Q, K, dtype=probs.dtype, device=device).index_add_(0, cells, probs).double()
