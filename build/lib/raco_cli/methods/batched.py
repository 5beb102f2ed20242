"""Batched training: the R runs of a sweep group trained as one vectorised problem.

A step of logistic regression on a tabular batch is a fraction of a MFLOP: the time of a run
is Python and dispatch overhead, paid again by every run of a figure.  Runs that share the
data, the split, the model (logistic regression), the method, T, the batch size and every
structural switch (sampling and dual modes, optimizer, selection rule, privacy scope,
``eval_every``) and differ only in what a sweep varies (seed, gamma, noise multipliers,
learning rates, tau, lambda_max, clip norm, DP-FERMI's options) are trained together on the
pieces of this module (the SGDA methods' loop in :mod:`raco_cli.methods.sgda.batched`,
DP-FERMI's in its ``fit_many``):

* weights (R, K, d) and biases (R, K), per-run duals (R, J) and optimizer states;
* run r draws its Poisson samples from its own sampling generator and its noise from its own
  noise generator, in the same order as a run alone, and every number of run r is computed
  from its own values in an order that does not depend on the group; on the CPU a run alone
  trains here too, as a group of one (:func:`trains_alone_here`), so a run computes the same
  numbers, to the last bit, alone and in any group (docs/batched.md, "One path");
* on the CPU the compiled data pass (:mod:`raco_cli.methods.batched_scan`); on an accelerator one
  gather of every run's batch rows and one batched matrix product per stage;
* every ``eval_every`` steps one evaluation of all runs per split, then each run's own
  checkpoint rule (:class:`raco_cli.methods.training.Checkpoints`: private report-noisy-max and
  noisy feasibility windows in ``privacy.scope=model``, exact selection in ``paper``).

Every noisy release of the group passes through :func:`raco_cli.privacy.releases.release`
(one call releases the R runs' histograms or gradient sums of a step).  Each run's DpEvent
tree is its own and unchanged: batching changes how the runs are computed, not what any run
releases.

DP standardisation (``dataset.preprocessing=dp``): each run has its own (mean, std) of the
numeric columns.  The group keeps the one public encoding of X and applies each run's affine
map to the rows it gathers (bit for bit the standardised rows of the one-run path,
:func:`raco_cli.privacy.preprocessing.standardize_columns`) and, for evaluation, folds it into
the weights, so R runs never hold R copies of the features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from raco_cli.constraints.rate import ConstraintSet
from raco_cli.data.types import SPLITS, TabularData
from raco_cli.methods import training
from raco_cli.methods.base import MethodSpec, NullReporter, Reporter, Seeds
from raco_cli.methods.group_rows import GroupSum
from raco_cli.methods.timing import StepClock
from raco_cli.metrics.evaluate import (
    binary_predictions,
    evaluate_binary_many,
    evaluate_many,
    predictions,
    split_constants,
)
from raco_cli.privacy.mechanisms import (
    NoiseSource,
    SecureNoise,
    gaussian_noise,
    laplace_noise,
    noise_source,
    secure_exponentials,
    secure_normals,
)
from raco_cli.privacy.preprocessing import unit_columns

EVAL_RUNS = 16  # runs per evaluation chunk

#: the compiled data pass (methods/batched_scan.py): on the CPU always (True or None), so that
#: a run computes the same numbers alone and in a group; False forces torch's path, the
#: accelerators' (tests run it on the CPU)
COMPILED_SCAN: bool | None = None


def compiled_scan_applies(device: torch.device) -> bool:
    """Whether a group's steps take the compiled data pass (:mod:`raco_cli.methods.batched_scan`):
    on the CPU, for every group and every run alone (a group of one), per-run DP
    standardisation included; torch's gather and products on an accelerator (docs/batched.md,
    "One path").  ``COMPILED_SCAN = False`` forces torch's path on the CPU (tests)."""
    return device.type == "cpu" and COMPILED_SCAN is not False


#: MethodSpec fields that may differ between the runs of a group (everything else must match);
#: ``train_size``: each run's released n~ under scope=model (its own q = B / n~, sampled by
#: ``poisson_sample_many`` at a per-run rate), so the seeds of a scope=model sweep group too
PER_RUN_FIELDS = (
    "lr", "momentum", "clip_norm", "noise_multiplier", "hist_noise_multiplier", "calibrate_noise", "lr_dual",
    "lambda_max", "temperature", "denominator_floor", "selection_eps", "preprocessing_noise", "options", "steps",
    "max_steps", "micro_batch", "precision", "train_size",
)  # fmt: skip


@dataclass
class Member:
    """One run of a group.

    Attributes:
        model: the run's logistic regression; initialised from ``seeds.init`` and, at the
            end, holding the selected checkpoint (as after a one-run ``fit``).
        constraints: the run's constraints (runs of a group differ only in gamma).
        spec: the run's method spec (after planning: calibrated noise, selection eps).
        seeds: the run's seeds.
        reporter: where the run's evaluations go (its MLflow run).
        scaling: (mean, std) of the DP standardisation of the first numeric columns, applied
            to the group's public X (None: X is used as it is).
    """

    model: nn.Module
    constraints: ConstraintSet
    spec: MethodSpec
    seeds: Seeds
    reporter: Reporter = field(default_factory=NullReporter)
    scaling: tuple[np.ndarray, np.ndarray] | None = None


def supports(data: TabularData, model: nn.Module) -> bool:
    """Whether a run can join a group: in-memory features and logistic regression.  Not
    ``dataset=table`` (its missing-value rule and its predictor artifact need the run's own
    standardised X: it trains alone, on this engine too, :func:`trains_alone_here`)."""
    return trains_alone_here(data, model) and "schema" not in data.meta


def trains_alone_here(data: TabularData, model: nn.Module, device: torch.device | None = None) -> bool:
    """Whether a run alone trains on this engine, as a group of one (docs/batched.md, "One
    path"): a classification task's in-memory features, logistic regression, and (``device``
    given) the CPU, where the compiled data pass makes its numbers those of the same run in
    any group."""
    from raco_cli.models import linear_layer

    return (isinstance(data.X, np.ndarray) and data.target is None and linear_layer(model) is not None
            and (device is None or compiled_scan_applies(device)))


def check_group(members: Sequence[Member]) -> None:
    """Raise ValueError unless the members may be trained as one problem (module docstring)."""
    if not members:
        raise ValueError("a group needs at least one run")
    first = members[0]
    if first.spec.objective.is_dro:
        raise ValueError("the batched engine trains objective=erm only (objective=dro runs train alone)")
    shared = {f: v for f, v in vars(first.spec).items() if f not in PER_RUN_FIELDS}
    for m in members[1:]:
        for key, value in shared.items():
            if getattr(m.spec, key) != value:
                raise ValueError(f"runs of a group differ in method.{key}: {value!r} vs {getattr(m.spec, key)!r}")
        if (m.spec.clip_norm is None) != (first.spec.clip_norm is None):
            raise ValueError("runs of a group must all clip or all not clip")
        a, b = first.constraints, m.constraints
        if not (a.J == b.J and a.Q == b.Q and np.array_equal(a.membership, b.membership) and np.array_equal(a.alpha, b.alpha)
                and np.array_equal(a.cell_of, b.cell_of)):
            raise ValueError("runs of a group must have the same constraints up to gamma")
        if (m.scaling is None) != (first.scaling is None) or (m.scaling is not None and len(m.scaling[0]) != len(first.scaling[0])):  # type: ignore[index]
            raise ValueError("runs of a group must all or none standardise the same numeric columns")


class GroupEvaluator:
    """Exact logits of every run on every split, then :func:`evaluate_many`.

    ``model_scope``: train is not evaluated and validation only counts correct predictions
    (what :class:`raco_cli.methods.training.Checkpoints` uses in ``privacy.scope=model``).

    On the CPU the logits come from the compiled :func:`raco_cli.methods.batched_scan.eval_logits`
    (each logit's products added in column order: a run's evaluation is the same alone or in a
    group, docs/batched.md); on an accelerator from one matrix product per split, the runs' DP
    standardisation folded into their weights.
    """

    def __init__(self, data: TabularData, members: Sequence[Member], device: torch.device, *, model_scope: bool) -> None:
        self.data, self.members, self.model_scope = data, members, model_scope
        self.m = len(members[0].scaling[0]) if members[0].scaling is not None else 0
        self.compiled = device.type == "cpu" and COMPILED_SCAN is not False
        self.X: dict[str, torch.Tensor] = {}
        self.XT: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # compiled: (rows transposed (d, n), their u (m, n))
        for split in self.splits(model_scope, members):
            idx = np.asarray(data.splits[split])
            X = np.asarray(data.rows(idx), dtype=np.float32).reshape(len(idx), -1)
            if self.compiled:
                self.XT[split] = (np.ascontiguousarray(X.T), np.ascontiguousarray(unit_columns(X[:, : self.m]).T))
                continue
            if self.m:  # u = (x + 1) / 2 of the public columns: the standardisation folds into the weights
                X = X.copy()
                X[:, : self.m] = np.clip((X[:, : self.m].astype(np.float64) + 1.0) / 2.0, 0.0, 1.0).astype(np.float32)
            self.X[split] = torch.as_tensor(X, device=device)
        # each split's labels, groups and what the evaluations derive from them alone, once
        splits = self.XT if self.compiled else self.X
        self.labels = {split: (data.y[np.asarray(data.splits[split])], data.group[np.asarray(data.splits[split])]) for split in splits}
        self.constants = {split: split_constants(y, g, members[0].constraints, len(data.group_names))
                          for split, (y, g) in self.labels.items()} if data.n_classes == 2 else {}
        mean = np.stack([mb.scaling[0] for mb in members]).astype(np.float64) if self.m else np.zeros((len(members), 0))  # type: ignore[index]
        std = np.stack([mb.scaling[1] for mb in members]).astype(np.float64) if self.m else np.ones((len(members), 0))  # type: ignore[index]
        self.scaling_np = (np.ascontiguousarray(mean), np.ascontiguousarray(std))
        if self.m:
            self.mean = torch.as_tensor(mean, dtype=torch.float64, device=device)
            self.std = torch.as_tensor(std, dtype=torch.float64, device=device)

    @staticmethod
    def splits(model_scope: bool, members: Sequence[Member]) -> tuple[str, ...]:
        """The splits the runs' records read (as :class:`raco_cli.methods.training.Checkpoints`
        evaluates them): every split in ``privacy.scope=paper``; under ``model`` the test split,
        and validation's correct counts when a run selects its checkpoint privately."""
        if not model_scope:
            return SPLITS
        noisy_selection = any(m.spec.selection == "best_feasible" for m in members)
        return ("val", "test") if noisy_selection else ("test",)

    @torch.no_grad()
    def logits(self, W: torch.Tensor, b: torch.Tensor, split: str) -> np.ndarray:
        """Float64 logits (R, n, K) of the runs' current parameters on a split; for two
        classes the float32 margins ``z_1 - z_0`` (R, n), one product with the weight
        differences (half the work, and all a binary evaluation needs), written run-major
        (each run's margins contiguous: the evaluation converts them to float64 a chunk of runs
        at a time, in cache, instead of transposing a (n, R) product)."""
        R, K, d = W.shape
        if self.compiled:
            from raco_cli.methods.batched_scan import eval_logits, margin_weights

            rows, u = self.XT[split]
            mean, std = self.scaling_np
            W_np, b_np = W.numpy(), b.numpy()
            if K == 2:
                Wm, bm = margin_weights(W_np, b_np)
                return eval_logits(rows, u, mean, std, Wm, bm)[:, 0, :]  # (R, n)
            return eval_logits(rows, u, mean, std, W_np, b_np).transpose(0, 2, 1).astype(np.float64)
        if self.m:  # x_std = (u - mean) / std: W_num x_std = (W_num / std) u - W_num mean / std
            Wn = W[..., : self.m].double()
            std_t, mean_t = self.std[:, None, :], self.mean[:, None, :]
            W = torch.cat([(Wn / std_t).float(), W[..., self.m :]], dim=2)
            b = (b.double() - (Wn * mean_t / std_t).sum(dim=2)).float()
        X = self.X[split]
        if K == 2:
            return torch.addmm((b[:, 1] - b[:, 0])[:, None], W[:, 1] - W[:, 0], X.t()).cpu().numpy()  # (R, n)
        Z = torch.addmm(b.reshape(R * K), X, W.reshape(R * K, d).t())  # (n, R*K)
        return Z.view(len(X), R, K).permute(1, 0, 2).double().cpu().numpy()

    def evaluate(self, W: torch.Tensor, b: torch.Tensor) -> list[dict[str, Any]]:
        """Per run, the metrics :meth:`Checkpoints.record` takes."""
        R = W.shape[0]
        out: list[dict[str, Any]] = [{} for _ in range(R)]
        data = self.data
        binary = W.shape[1] == 2
        for split in self.labels:
            y, group = self.labels[split]
            Z = self.logits(W, b, split)
            if self.model_scope and split == "val":  # only the correct count is used (privately)
                pred = binary_predictions(Z) if binary else predictions(Z)
                acc = (pred == y).mean(axis=1) if len(y) else np.full(R, np.nan)
                for r in range(R):
                    out[r][split] = {"n": int(len(y)), "accuracy": float(acc[r])}
                continue
            for lo in range(0, R, EVAL_RUNS):  # a few runs at a time: their (n,) arrays stay in cache
                chunk = self.members[lo : lo + EVAL_RUNS]
                constraints, temperatures = [m.constraints for m in chunk], [m.spec.temperature for m in chunk]
                if binary:
                    metrics = evaluate_binary_many(Z[lo : lo + EVAL_RUNS], y, group, constraints=constraints, temperatures=temperatures,
                                                   group_names=data.group_names, class_names=data.class_names, split=self.constants.get(split))
                else:
                    metrics = evaluate_many(Z[lo : lo + EVAL_RUNS], y, group, constraints=constraints, temperatures=temperatures,
                                            group_names=data.group_names, class_names=data.class_names)
                for r, m in enumerate(metrics, start=lo):
                    out[r][split] = m
        return out


class GroupOptimizer:
    """The primal update of :class:`raco_cli.methods.training._Optimizer` for R runs at once:
    plain SGD, heavy-ball momentum or Adam (torch's update rules, defaults betas (0.9, 0.999),
    eps 1e-8), each run with its own step size (and momentum)."""

    def __init__(self, specs: Sequence[MethodSpec], device: torch.device) -> None:
        self.kind = specs[0].optimizer
        self.lr = np.array([s.lr for s in specs], dtype=np.float64)
        self.momentum = torch.tensor([s.momentum for s in specs], dtype=torch.float32, device=device)
        self.device = device
        self.state: list[dict[str, torch.Tensor]] = []
        self.t = 0

    def _per_run(self, values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(values, dtype=like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))

    @torch.no_grad()
    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor], *, scale: float | np.ndarray) -> None:
        """One update; ``scale``: the normaliser of the noisy sums, one for all runs or one per run
        (runs whose released training sizes differ, privacy/size.py)."""
        scales = np.asarray(scale, dtype=np.float64)
        if scales.ndim and np.all(scales == scales.flat[0]):  # one value: the scalar path, bit for bit
            scales = np.asarray(scales.flat[0])
        self.t += 1
        if not self.state:
            self.state = [{} for _ in params]
        for p, g, st in zip(params, grads, self.state):
            if self.kind == "sgd":
                p.add_(g * self._per_run(-(self.lr * scales), p))
                continue
            g = g * (float(scales) if not scales.ndim else self._per_run(scales, g))
            if self.kind == "momentum":
                mom = self.momentum.view(-1, *([1] * (p.dim() - 1)))
                st["buf"] = g.clone() if "buf" not in st else st["buf"] * mom + g
                p.add_(st["buf"] * self._per_run(-self.lr, p))
                continue
            # (one IEEE operation per call: a fused lerp or addcmul may round its vectorised
            # entries and its last few apart, and a run's entries sit anywhere in the group's tensor)
            beta1, beta2, eps = 0.9, 0.999, 1e-8
            if "m" not in st:
                st["m"], st["v"] = torch.zeros_like(p), torch.zeros_like(p)
            st["m"].add_((g - st["m"]) * (1 - beta1))
            st["v"].mul_(beta2).add_(g * g * (1 - beta2))
            step_size = self.lr / (1 - beta1**self.t)
            denom = (st["v"].sqrt() / (1 - beta2**self.t) ** 0.5).add_(eps)
            p.add_(st["m"] / denom * self._per_run(-step_size, p))


def noise_sources(members: Sequence[Member], device: torch.device) -> list[NoiseSource]:
    return [noise_source(m.seeds.noise, device, secure=m.spec.secure_rng) for m in members]


def gaussian_many(shape: tuple[int, ...], stds: Sequence[float], sources: Sequence[NoiseSource], *, dtype: torch.dtype) -> torch.Tensor:
    """(R, *shape): run r's ``gaussian_noise(shape, stds[r], sources[r])`` (its next draw).

    Seeded torch generators: each run's standard normals are drawn into its slice of one
    tensor (its own generator, the draws ``gaussian_noise`` makes), then every run is scaled
    by its std in one product, the same float multiply ``gaussian_noise`` does per run."""
    secure = _secure(sources)
    if secure is not None:  # every run's normals from one CSPRNG read, then each run's std, in float64 as gaussian_noise
        z = secure_normals(secure, (len(sources),), math.prod(shape))
        return (z * per_run(stds, z.device, dims=2, dtype=torch.float64)).reshape(len(sources), *shape).to(dtype)
    seeded = _seeded(sources)
    if seeded is None:  # seeded and secure runs mixed: run by run
        return torch.stack([gaussian_noise(shape, s, g, dtype=dtype) for s, g in zip(stds, sources)])
    z = torch.empty((len(seeded), *shape), dtype=dtype, device=seeded[0].device)
    for g, out in zip(seeded, z.unbind(0)):  # (unbind: R views in one call, not one indexing each)
        torch.randn(shape, generator=g, dtype=dtype, out=out)
    return z.mul_(per_run(stds, z.device, dims=z.dim(), dtype=dtype))


def laplace_many(shape: tuple[int, ...], scales: Sequence[float], sources: Sequence[NoiseSource]) -> torch.Tensor:
    """(R, *shape) float64: run r's ``laplace_noise(shape, scales[r], sources[r])``.

    Seeded torch generators: each run's two Exp(1) tensors are drawn into its slice of one
    tensor, then ``scale_r * (e0 - e1)`` of every run in two vectorised float64 operations."""
    secure = _secure(sources)
    if secure is not None:  # every run's Exp(1) pairs from one CSPRNG read, as laplace_noise
        e = secure_exponentials(secure, (len(sources), 2, *shape))
        return per_run(scales, e.device, dims=e.dim() - 1, dtype=torch.float64) * (e[:, 0] - e[:, 1])
    seeded = _seeded(sources)
    if seeded is None:  # seeded and secure runs mixed: run by run
        return torch.stack([laplace_noise(shape, s, g) for s, g in zip(scales, sources)])
    e = torch.empty((len(seeded), 2, *shape), dtype=torch.float64, device=seeded[0].device)
    for g, out in zip(seeded, e.unbind(0)):
        out.exponential_(generator=g)
    return per_run(scales, e.device, dims=e.dim() - 1, dtype=torch.float64) * (e[:, 0] - e[:, 1])


def _secure(sources: Sequence[NoiseSource]) -> SecureNoise | None:
    """The first source when every one is a :class:`SecureNoise` (on one device): R runs' draws
    are then one read of the OS CSPRNG, run r's block where its own call would have read it."""
    if sources and all(isinstance(g, SecureNoise) and g.device == sources[0].device for g in sources):
        return sources[0]  # type: ignore[return-value]
    return None


def _seeded(sources: Sequence[NoiseSource]) -> list[torch.Generator] | None:
    """The sources as seeded torch generators; None when there are none or any is a
    :class:`SecureNoise` (whose draws :func:`gaussian_noise` and :func:`laplace_noise` transform)."""
    seeded = [g for g in sources if isinstance(g, torch.Generator)]
    return seeded if seeded and len(seeded) == len(sources) else None


def group_softmax(z: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(tau_r * z)`` over classes of (R, K, L) class-major logits (tau_r per run,
    shape (R, 1, 1)).  Class-major: torch's CPU softmax and reductions over a short class
    axis are several times faster when it is not the innermost one."""
    return torch.softmax(z if temperature is None else z * temperature, dim=1)


def group_onehots(z: torch.Tensor) -> torch.Tensor:
    """Arg-max one-hots (R, K, L) of class-major logits (R, K, L), as
    ``one_hot(z.argmax(dim=1))``: the first maximal class, a NaN counting as the maximum.
    Built from K - 1 comparisons: torch's CPU ``argmax`` over a class axis that is not the
    innermost one took ~10x as long (R = 100 runs x 8 192 rows of Heart: 84 vs 8 ms)."""
    best, idx = z[:, 0], torch.zeros(z.shape[0], z.shape[2], dtype=torch.long, device=z.device)
    for k in range(1, z.shape[1]):
        zk = z[:, k]
        better = (zk > best) | (zk.isnan() & ~best.isnan())  # argmax: NaN above every number; ties keep the first
        idx, best = torch.where(better, k, idx), torch.where(better, zk, best)
    return (idx.unsqueeze(1) == torch.arange(z.shape[1], device=z.device).view(1, -1, 1)).to(z.dtype)


def group_logits(W: torch.Tensor, b: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Class-major logits (R, K, L) of rows X (R, L, d) under weights W (R, K, d), biases b (R, K)."""
    return torch.baddbmm(b.unsqueeze(2), W, X.transpose(1, 2))


@torch.no_grad()
def clipped_sums(
    rows: dict[str, torch.Tensor], z: torch.Tensor, c: torch.Tensor | None, *, reg_temp: torch.Tensor | None,
    temperature: torch.Tensor | None, clip: torch.Tensor | None,
) -> GroupSum:
    """:meth:`raco_cli.methods.gradients.LinearEngine.clipped_sum` of R runs: the logit
    gradient ``g = (p - e_y) + reg_scale tau pt (c - <c, pt>)``, norms ``|g| sqrt(|x|^2 + 1)``,
    clip factors ``min(1, C_r / |g|)`` (0 for non-finite rows and pad slots), then
    ``sum_i g_i x_i^T`` as one batched product.

    Args:
        rows: :meth:`raco_cli.methods.group_rows.GroupRows.gather` of the gradient batches.
        z: (R, K, L) class-major logits of those rows.
        c: (R, K, L) regularizer weights of the rows, or None.
        reg_temp: (R, 1, 1) ``reg_scale * tau`` per run (with ``c``).
        temperature: (R, 1, 1) tau per run, None when every tau is 1.
        clip: (R, 1) clipping norms, None: no clipping.
    """
    p = group_softmax(z)
    g = p - rows["onehot"].transpose(1, 2)
    if c is not None:
        if reg_temp is None:
            raise ValueError("regularizer weights need reg_temp")
        pt = p if temperature is None else group_softmax(z, temperature)
        g = g + reg_temp * pt * (c - (c * pt).sum(dim=1, keepdim=True))
    norms = torch.sqrt((g * g).sum(dim=1)) * rows["xnorm"]
    valid = rows["valid"]
    finite = torch.isfinite(norms)
    if clip is None:
        factors = torch.ones_like(norms)
    else:
        factors = torch.clamp(clip / (norms + 1e-12), max=1.0)
    keep = finite & valid
    factors = torch.where(keep, factors, torch.zeros_like(factors))
    gs = torch.nan_to_num(g * factors[:, None, :], nan=0.0, posinf=0.0, neginf=0.0)
    counted = torch.where(keep, norms, torch.zeros_like(norms))
    clipped = ((norms > clip) & valid).sum(dim=1) if clip is not None else torch.zeros(len(z), dtype=torch.long)
    return GroupSum(
        grad_w=torch.bmm(gs, rows["X"]), grad_b=gs.sum(dim=2), clipped=clipped,
        norm_sum=counted.sum(dim=1), nonfinite=(~finite & valid).sum(dim=1),
    )


def initial_parameters(members: Sequence[Member], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[nn.Linear]]:
    """Each run's model initialised from its init seed (as alone), stacked: W (R, K, d), b (R, K).
    Each run's layer then holds views of its rows of W and b, so its model shows the run's
    parameters at every step (a release hook reads them, as in the one-run loop)."""
    from raco_cli.models import linear_layer

    layers = []
    for m in members:
        training.initialize(m.model, m.seeds.init)
        m.model.to(device)
        layers.append(linear_layer(m.model))
    W = torch.stack([layer.weight.detach().clone() for layer in layers])
    b = torch.stack([layer.bias.detach().clone() for layer in layers])
    for r, layer in enumerate(layers):
        layer.weight.data, layer.bias.data = W[r], b[r]
    return W, b, layers


def per_run(values: Sequence[float], device: torch.device, *, dims: int = 3, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(list(values), dtype=dtype, device=device).view(-1, *([1] * (dims - 1)))


class GroupCheckpoints:
    """Each run's :class:`raco_cli.methods.training.Checkpoints`, fed one group evaluation."""

    def __init__(self, data: TabularData, members: Sequence[Member], layers: Sequence[nn.Linear], device: torch.device,
                 *, steps: int | Sequence[int] | None = None) -> None:
        """``steps``: the runs' T (one for all, or one per run: selection=average's tail)."""
        self.members, self.layers = members, layers
        self.model_scope = members[0].spec.scope == "model"
        self.evaluator = GroupEvaluator(data, members, device, model_scope=self.model_scope)
        per_run = steps if isinstance(steps, Sequence) else [steps] * len(members)
        self.runs = [
            training.Checkpoints(None, m.model, data, m.constraints, m.spec, device=device, reporter=m.reporter,
                                 selection_seed=m.seeds.selection, steps=T)
            for m, T in zip(members, per_run)
        ]

    @torch.no_grad()
    def record(self, step: int, W: torch.Tensor, b: torch.Tensor, lam: np.ndarray, windows: Sequence[tuple[Any, int] | None], *,
               due: np.ndarray | None = None) -> None:
        """Evaluate the group; record the runs ``due`` (default all) at ``step``."""
        metrics = self.evaluator.evaluate(W, b)
        for r, run in enumerate(self.runs):  # (each run's layer views its rows of W and b: initial_parameters)
            if due is not None and not due[r]:
                continue
            run.record(step, [float(v) for v in lam[r]], window=windows[r], metrics=metrics[r])

    @torch.no_grad()
    def finish(self) -> list[tuple[list, int, dict]]:
        """Each run's :meth:`~raco_cli.methods.training.Checkpoints.finish`; the runs with
        ``selection=average`` get their averaged parameters evaluated as one group evaluation."""
        averaged = [run.averaged_state() for run in self.runs]
        if all(a is None for a in averaged):
            return [run.finish() for run in self.runs]
        for m, a in zip(self.members, averaged):
            if a is not None:
                m.model.load_state_dict(a)
        W = torch.stack([layer.weight.detach() for layer in self.layers])
        b = torch.stack([layer.bias.detach() for layer in self.layers])
        metrics = self.evaluator.evaluate(W, b)
        return [run.finish(metrics[r] if a is not None else None) for r, (run, a) in enumerate(zip(self.runs, averaged))]


def report_step(reporter: Reporter | None, members: Sequence[Member], t: int, steps: int, *, evaluate: bool,
                batch: np.ndarray | None = None) -> None:
    """The group's step to its reporter (a progress bar); each run's at evaluations only
    (heartbeats: a step report per run per step would cost more than the step), a run alone's
    at every step with its batch size ``batch[0]`` (as the one-run loop reports it)."""
    if reporter is not None:
        reporter.on_step(t, steps, {})
    if len(members) == 1 and batch is not None:
        members[0].reporter.on_step(t, steps, {"batch": float(batch[0])})
    elif evaluate:
        for m in members:
            m.reporter.on_step(t, steps, {})


def run_stats(r: int, *, steps: int, rows: np.ndarray, clipped: Any, norm_sum: Any, nonfinite: Any,
              clock: StepClock, sample_rate: float) -> dict[str, Any]:
    """Run r's statistics, as the one-run loop reports them; step times are its share of the
    group's step (1/R), with the group's step time beside them (a run alone: none)."""
    R, n_rows = len(rows), int(rows[r])
    grouped = {"batched": {"runs": R, "group_step_ms": clock.steady_ms}} if R > 1 else {}
    return {
        "mean_batch_size": float(n_rows) / max(steps, 1),
        "clip_fraction": float(clipped[r]) / max(n_rows, 1),
        "mean_grad_norm": float(norm_sum[r]) / max(n_rows, 1),
        "nonfinite_rows": float(nonfinite[r]),
        "time_per_step_ms": clock.steady_ms / R,
        "first_step_ms": clock.first_ms / R,
        "throughput_images_per_s": float(n_rows) * R / clock.total_s if clock.total_s > 0 else 0.0,
        **grouped,
        "sample_rate": sample_rate,
    }
