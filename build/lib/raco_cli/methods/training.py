"""What every method's training loop shares: the training rows on the device, the seeded
initialisation, the primal optimizer, the exact evaluation of every split and the checkpoint
rule (:class:`Checkpoints`).

The SGDA loop (:mod:`raco_cli.methods.sgda.core`), DP-FERMI, DPSE, the DRO loops and the
batched engine all train through these, so a checkpoint, an evaluation or an optimizer step
means the same for every method.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import SPLITS, TabularData
from raco_cli.methods.base import EvalRecord, MethodSpec, Reporter, select_checkpoint
from raco_cli.metrics.evaluate import accuracy_only, evaluate, evaluate_regression
from raco_cli.privacy import releases
from raco_cli.privacy.mechanisms import noise_source
from raco_cli.privacy.selection import NoisyArgmax

EVAL_CHUNK = 8192
EVAL_CHUNK_BYTES = 2**27  # 128 MiB of features per evaluation chunk


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
        them stacked, gathered in one pass so one forward pass can serve every batch.

        Packed rows: the last set (the gradient batch) gets every engine argument; the earlier
        ones (histogram batches) only their features and cells, all a histogram reads.
        """
        if not self.pack:
            return [self.batch(b, labels=labels) for b in idx], None
        P = self._gather(torch.cat(idx)) if len(idx) > 1 else self._gather(idx[0])
        out, start = [], 0
        for i, b in enumerate(idx):
            rows = P[start : start + len(b)]
            out.append(self._split(rows, b, labels=labels) if i == len(idx) - 1 else self._features_and_cells(rows))
            start += len(b)
        return out, P[:, : self.d]

    def _gather(self, b: torch.Tensor) -> torch.Tensor:
        if self._packed_np is not None:
            return torch.from_numpy(np.take(self._packed_np, b.numpy(), axis=0))
        return self.packed.index_select(0, b)

    def _split(self, P: torch.Tensor, b: torch.Tensor, *, labels: bool) -> dict[str, torch.Tensor]:
        d, K = self.d, self.K
        out = {**self._features_and_cells(P), "xnorm": P[:, d + K]}
        if self.regression:
            out["target"] = P[:, d]
        else:
            out["onehot"] = P[:, d : d + K]
        if labels:
            out["y"] = self.y.index_select(0, b)
        return out

    def _features_and_cells(self, P: torch.Tensor) -> dict[str, torch.Tensor]:
        d, K, Q = self.d, self.K, self.Q
        out = {"X": P[:, :d]}
        if Q:
            out["cellhot"] = P[:, d + K + 1 : d + K + 1 + Q]
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
                 robust: bool = False, splits: tuple[str, ...] = SPLITS, accuracy_splits: tuple[str, ...] = ()) -> dict:
    """Metrics of ``splits`` (default every split; non-private: model selection is not
    accounted, as in the paper); ``robust``: with ROC AUC (the DRO runs,
    :mod:`raco_cli.metrics.robust`); ``accuracy_splits``: the classification splits of which
    only ``n`` and ``accuracy`` are read (:func:`raco_cli.metrics.evaluate.accuracy_only`)."""
    out = {}
    for split in splits:
        idx = np.asarray(data.splits[split])
        logits = predict_logits(engine, data, idx, device)
        if split in accuracy_splits and data.target is None:
            out[split] = accuracy_only(logits, data.y[idx])
            continue
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
        steps: int | None = None,
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
        # selection=average: the mean of the checkpoints of the second half of training (steps >= T/2)
        self.tail_from = None if spec.selection != "average" else (steps or 0) / 2
        self.tail: tuple[dict[str, torch.Tensor], int] | None = None  # (running sum of the states, count)
        self.tail_window: tuple[Any, int] | None = None  # the noisy dual gradients of those steps
        if self.model_scope and spec.selection == "best_feasible":
            if not spec.selection_eps > 0:
                raise ValueError("scope=model with selection=best_feasible needs selection_eps > 0")
            self.noisy_max = NoisyArgmax(spec.selection_eps, noise_source(selection_seed, "cpu", secure=spec.secure_rng))
        # scope=model reads the test metrics and, for the noisy selection, validation's correct
        # count: train is not evaluated, validation only counted (the main job's 85 evaluations
        # 0.87 -> 0.28 s; the group path's GroupEvaluator does the same)
        self.eval_splits: tuple[str, ...] = SPLITS
        if self.model_scope:
            self.eval_splits = ("val", "test") if self.noisy_max is not None else ("test",)

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
            metrics = self._evaluate()
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
        if self.tail_from is not None and step >= self.tail_from:
            self._add_to_tail(self.states[index], window)
        if self.model_scope:
            self._pending, self._pending_window = index, window
        else:
            self._prune()
            self.reporter.on_eval(self.history[-1])
        return self.history[-1]

    def _evaluate(self) -> dict[str, Any]:
        return evaluate_all(self.engine, self.data, self.constraints, temperature=self.spec.temperature, device=self.device,
                            robust=self.spec.objective.is_dro, splits=self.eval_splits, accuracy_splits=("val",) if self.model_scope else ())

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

    def _add_to_tail(self, state: dict[str, torch.Tensor], window: tuple[Any, int] | None) -> None:
        if self.tail is None:
            self.tail = ({k: v.double() if v.is_floating_point() else v for k, v in state.items()}, 1)
        else:
            total, count = self.tail
            self.tail = ({k: total[k] + v if v.is_floating_point() else v for k, v in state.items()}, count + 1)
        self.tail_window = _add_windows(self.tail_window, window)

    def averaged_state(self) -> dict[str, torch.Tensor] | None:
        """selection=average: the mean of the tail checkpoints' parameters (integer buffers: the
        last), or None when there is nothing to average.  Post-processing of the releases."""
        if self.tail is None:
            return None
        total, count = self.tail
        like = self.states[len(self.history) - 1]
        return {k: (v / count).to(like[k].dtype) if like[k].is_floating_point() else like[k] for k, v in total.items()}

    def finish(self, averaged_metrics: dict[str, Any] | None = None) -> tuple[list[EvalRecord], int, dict]:
        """The history, the reported checkpoint's index and its state.

        selection=average: the tail mean is evaluated (here, or by the caller who passes its
        ``averaged_metrics``: batched training) and reported as one more record at the last
        step, its feasibility read from the noisy dual gradients of the averaged steps."""
        self._settle()
        averaged = self.averaged_state()
        if averaged is not None:
            self.model.load_state_dict(averaged)
            metrics = averaged_metrics
            if metrics is None:
                metrics = self._evaluate()
            if self.model_scope:
                metrics = {"test": metrics["test"], "release": _feasibility(self.tail_window)}
            last = self.history[-1]
            self.history.append(EvalRecord(step=last.step, metrics=metrics, lam=last.lam))
            self.states[len(self.history) - 1] = averaged  # (its metrics reach MLflow as final/*, not as a history point)
            return self.history, len(self.history) - 1, averaged
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
