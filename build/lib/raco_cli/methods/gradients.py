"""Per-sample gradients of the RaCO-DP objective, clipped and summed (paper eq. 10).

The per-sample objective of row i (loss plus the rescaled per-sample regularizer) is::

    o_i(theta) = CE(h(x_i), y_i) + reg_scale * sum_k c[i, k] * softmax(tau * h(x_i))_k

with ``reg_scale = q |D|`` and ``c[i] = cell_weights[cell(i)]`` (SPEC section 1, step 3).
Each engine returns ``sum_i clip(grad o_i, C)`` (no clipping when ``clip_norm`` is None),
parameter by parameter, without noise.

* :class:`LinearEngine`: logistic regression in closed form.  The gradient of o_i with
  respect to the logits is ``g_i = (p_i - e_{y_i}) + reg_scale * tau * pt_i * (c_i - <c_i, pt_i>)``
  (``p = softmax(z)``, ``pt = softmax(tau z)``), the weight gradient is the outer product
  ``g_i x_i^T``, so its norm is ``|g_i| * sqrt(|x_i|^2 + 1)`` and the clipped sum is one
  matrix product: no per-sample gradient is ever materialised.
* :class:`FunctionalEngine`: any model, with ``torch.func`` (vmap of grad) over
  micro-batches, so memory is bounded for any Poisson batch size.

``task=regression`` (``loss="squared"``): one output z, the per-sample loss is the DPSE
paper's squared error ``(z_i - t_i)^2`` with real-valued target t (Section 2, "Linear
Regression with DP"), so ``g_i = 2 (z_i - t_i)`` and the weight gradient is ``g_i x_i``, as in
its Algorithm 3, line 6; there is no regularizer (rate constraints need class rates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn


@dataclass
class ClippedSum:
    """Result of one engine call (statistics stay tensors: no device sync per step).

    Attributes:
        grads: clipped per-sample gradients summed over the batch, one per parameter.
        clipped: number of rows whose gradient norm exceeded C.
        norm_sum: sum of the finite unclipped per-sample gradient norms.
        nonfinite: number of rows with a non-finite gradient (their contribution is dropped,
            which keeps the sum's sensitivity bounded and the model finite).
    """

    grads: list[torch.Tensor]
    clipped: torch.Tensor
    norm_sum: torch.Tensor
    nonfinite: torch.Tensor


def clip_factors(norms: torch.Tensor, clip_norm: float | None, finite: torch.Tensor) -> torch.Tensor:
    """Per-row factors ``min(1, C / |g|)``; 0 for non-finite norms; 1 without clipping."""
    if clip_norm is None:
        factors = torch.ones_like(norms)
    else:
        factors = torch.clamp(clip_norm / (norms + 1e-12), max=1.0)
    return torch.where(finite, factors, torch.zeros_like(factors))


def clip_stats(norms: torch.Tensor, clip_norm: float | None, finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped count, sum of the finite norms and non-finite count of one batch's per-record norms."""
    clipped = (norms > clip_norm).sum() if clip_norm is not None else torch.zeros((), dtype=torch.long, device=norms.device)
    return clipped, torch.where(finite, norms, torch.zeros_like(norms)).sum(), (~finite).sum()


def row_softmax(z: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``softmax(temperature * z)`` over classes (dim 1), shape (n, K).

    Torch's CPU softmax is slow along a short last dimension (K = 2: ~25 us for 512 rows);
    along the first dimension of the transposed view it is ~5x faster, same values.
    """
    s = z if temperature == 1.0 else temperature * z
    if z.shape[1] <= 32:
        return torch.softmax(s.t(), dim=0).t().contiguous()
    return torch.softmax(s, dim=1)


Loss = Literal["cross_entropy", "squared"]
LOSSES = ("cross_entropy", "squared")


def squared_error(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per-row squared error ``(z_i - t_i)^2`` of a one-output model, shape (n,).

    >>> squared_error(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])).tolist()
    [1.0, 4.0]
    """
    return (z[:, 0] - t.to(z.dtype)) ** 2


class LinearEngine:
    """Closed-form clipped per-sample gradient sums for a linear model: softmax cross-entropy
    (``loss="cross_entropy"``) or squared error of one output (``loss="squared"``); the bias
    is optional (``nn.Linear(bias=False)``: the weight gradient alone, norm ``|g_i| |x_i|``)."""

    def __init__(self, layer: nn.Linear, *, loss: Loss = "cross_entropy") -> None:
        self.layer, self.loss = layer, loss
        self.params = [layer.weight] if layer.bias is None else [layer.weight, layer.bias]

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        if self.layer.bias is None:
            return X.flatten(1) @ self.layer.weight.t()
        return torch.addmm(self.layer.bias, X.flatten(1), self.layer.weight.t())

    @torch.no_grad()
    def clipped_sum(
        self,
        X: torch.Tensor,
        y: torch.Tensor | None = None,
        c: torch.Tensor | None = None,
        *,
        reg_scale: float,
        temperature: float,
        clip_norm: float | None,
        onehot: torch.Tensor | None = None,
        xnorm: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        target: torch.Tensor | None = None,
        probs: torch.Tensor | None = None,
    ) -> ClippedSum:
        """Clipped sum; ``onehot``/``xnorm`` (``sqrt(|x|^2 + 1)``) may be precomputed per row,
        and ``probs``, the tempered softmax ``softmax(temperature * z)`` of the rows' logits
        (raco_dp's step computes it once for its histogram and its gradient batch);
        ``loss="squared"`` reads the real-valued ``target`` (or ``y``) instead of labels."""
        X = X.flatten(1)
        z = self.logits(X) if logits is None else logits
        if self.loss == "squared":
            t = target if target is not None else y
            if t is None or c is not None:
                raise ValueError("the squared loss needs a target and takes no regularizer")
            g = 2.0 * (z - t.to(z.dtype)[:, None])  # d/dz (z - t)^2
        else:
            if onehot is None:
                if y is None:
                    raise ValueError("clipped_sum needs y or onehot")
                onehot = nn.functional.one_hot(y, z.shape[1]).to(z.dtype)
            p = probs if probs is not None and temperature == 1.0 else row_softmax(z)
            g = p - onehot
            if c is not None:
                pt = probs if probs is not None else p if temperature == 1.0 else row_softmax(z, temperature)
                g = g + (reg_scale * temperature) * pt * (c - (c * pt).sum(dim=1, keepdim=True))
        bias = self.layer.bias is not None
        if xnorm is None:  # (precomputed rows come sanitised: see methods.training.Rows)
            X = torch.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0)
            xnorm = torch.where(torch.isfinite(g).all(dim=1), torch.sqrt((X * X).sum(dim=1) + float(bias)), float("inf"))
        elif not bias:  # the packed norm includes the bias coordinate: recompute |x| (bad rows stay inf)
            xnorm = torch.where(torch.isfinite(xnorm), X.norm(dim=1), xnorm)
        norms = g.norm(dim=1) * xnorm
        finite = torch.isfinite(norms)
        # non-finite rows: factor 0 and nan_to_num drop them without a device sync
        gs = torch.nan_to_num(g * clip_factors(norms, clip_norm, finite)[:, None], nan=0.0, posinf=0.0, neginf=0.0)
        clipped, norm_sum, nonfinite = clip_stats(norms, clip_norm, finite)
        grads = [gs.t() @ X, gs.sum(dim=0)] if bias else [gs.t() @ X]
        return ClippedSum(grads=grads, clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32; fp32/fp64 unchanged."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class FunctionalEngine:
    """Clipped per-sample gradient sums for any model, via torch.func over micro-batches.

    A Poisson batch of any size is cut into chunks of ``micro_batch`` rows; the per-sample
    gradients of one chunk are materialised (``micro_batch x n_params`` floats), clipped and
    added to the running sum, so memory is bounded and the result equals one pass over the
    whole batch (like Opacus' BatchMemoryManager, but exact: clipping is per row anyway).

    Mixed precision (``amp_dtype``, CUDA bf16 by default via ``precision=auto``): only the
    forward/backward *arithmetic* of the model runs under autocast.  Parameters, the
    per-sample gradients (autocast returns gradients in the parameters' fp32 dtype), their
    norms, the clipping factors, the sum and the Gaussian noise stay fp32.  Privacy needs
    only that each row's contribution to the released sum has norm <= C, which the fp32
    clipping enforces whatever the precision of the gradient it is applied to; reduced
    precision changes the gradient's accuracy (utility), never the sensitivity bound.  The
    loss and the tempered softmax of the regularizer are computed from fp32 logits.  bf16
    has fp32's exponent range, so small per-sample gradients do not underflow (fp16 would
    need loss scaling, which would interact with clipping: not offered).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        micro_batch: int,
        amp_dtype: torch.dtype | None = None,
        eval_chunk: int | None = None,
        loss: Loss = "cross_entropy",
    ) -> None:
        self.model, self.loss = model, loss
        self.micro_batch = int(micro_batch)
        self.amp_dtype = amp_dtype
        self.eval_chunk = int(eval_chunk) if eval_chunk is not None else max(self.micro_batch, 1)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in model.named_parameters() if p.requires_grad]

    def _autocast(self, device: torch.device):
        return torch.autocast(device_type=device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None)

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        with self._autocast(X.device):
            return _upcast(self.model(X))

    def clipped_sum(
        self,
        X: torch.Tensor,
        y: torch.Tensor,
        c: torch.Tensor | None,
        *,
        reg_scale: float,
        temperature: float,
        clip_norm: float | None,
        **_: object,
    ) -> ClippedSum:
        if clip_norm is None:
            return self._plain_sum(X, y, c, reg_scale=reg_scale, temperature=temperature)
        from torch.func import functional_call, grad, vmap

        params = {n: p.detach() for n, p in zip(self.names, self.params)}
        buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        has_c = c is not None
        device = X.device

        def objective(p, x, t, ci):  # one row; batch dims added for the module
            with self._autocast(device):
                z = functional_call(self.model, (p, buffers), (x.unsqueeze(0),))
            z = _upcast(z)
            loss = self._row_loss(z, t.unsqueeze(0))[0]
            if has_c:
                loss = loss + reg_scale * (ci * torch.softmax(temperature * z, dim=1)[0]).sum()
            return loss

        per_sample = vmap(grad(objective), in_dims=(None, 0, 0, 0))
        total = [torch.zeros_like(p) for p in self.params]
        zero = torch.zeros((), device=X.device)
        clipped, norm_sum, nonfinite = zero.long(), zero, zero.long()
        cc = c if c is not None else torch.zeros(len(y), 1, device=X.device)
        for start in range(0, len(y), self.micro_batch):
            sl = slice(start, start + self.micro_batch)
            g = per_sample(params, X[sl], y[sl], cc[sl])
            g = {n: _upcast(v) for n, v in g.items()}  # fp32 norms and sums (a no-op: autocast returns param-dtype grads)
            norms = torch.sqrt(sum((g[n].flatten(1) ** 2).sum(dim=1) for n in self.names))
            finite = torch.isfinite(norms)
            factors = clip_factors(norms, clip_norm, finite)
            for acc, n in zip(total, self.names):
                acc += torch.tensordot(factors, torch.nan_to_num(g[n], nan=0.0, posinf=0.0, neginf=0.0), dims=1)
            a, b, d = clip_stats(norms, clip_norm, finite)
            clipped, norm_sum, nonfinite = clipped + a, norm_sum + b, nonfinite + d
            del g
        return ClippedSum(grads=total, clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite)

    def _row_loss(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Per-row loss (n,): cross-entropy of labels, or the squared error of a target."""
        if self.loss == "squared":
            return squared_error(z, t)
        return nn.functional.cross_entropy(z, t, reduction="none")

    def _plain_sum(self, X: torch.Tensor, y: torch.Tensor, c: torch.Tensor | None, *, reg_scale: float, temperature: float) -> ClippedSum:
        """Without clipping (non-private methods) the sum of per-sample gradients is the
        gradient of the summed objective: one ordinary backward per micro-batch, no per-sample
        gradients (rows are independent: the models have no batch statistics).  Per-sample
        norms are not computed (``norm_sum`` is NaN); rows with a non-finite objective are
        dropped, as in the clipped path."""
        total = [torch.zeros_like(p) for p in self.params]
        nonfinite = torch.zeros((), dtype=torch.long, device=X.device)
        for start in range(0, len(y), self.micro_batch):
            sl = slice(start, start + self.micro_batch)
            with torch.enable_grad():
                with self._autocast(X.device):
                    z = self.model(X[sl])
                z = _upcast(z)
                per_row = self._row_loss(z, y[sl])
                if c is not None:
                    per_row = per_row + reg_scale * (c[sl] * torch.softmax(temperature * z, dim=1)).sum(dim=1)
                finite = torch.isfinite(per_row)
                grads = torch.autograd.grad(torch.where(finite, per_row, torch.zeros_like(per_row)).sum(), self.params)
            for acc, g in zip(total, grads):
                acc += torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
            nonfinite = nonfinite + (~finite).sum()
        nan = torch.full((), float("nan"), device=X.device)
        return ClippedSum(grads=total, clipped=torch.zeros_like(nonfinite), norm_sum=nan, nonfinite=nonfinite)


def engine_for(
    model: nn.Module,
    *,
    micro_batch: int,
    prefer_closed_form: bool = True,
    amp_dtype: torch.dtype | None = None,
    eval_chunk: int | None = None,
    loss: Loss = "cross_entropy",
):
    """The fastest correct engine for a model: closed form for a linear model (always
    fp32), torch.func micro-batches otherwise; ``loss="squared"`` for ``task=regression``."""
    from raco_cli.models import linear_layer

    layer = linear_layer(model) if prefer_closed_form else None
    if layer is not None:
        return LinearEngine(layer, loss=loss)
    return FunctionalEngine(model, micro_batch=micro_batch, amp_dtype=amp_dtype, eval_chunk=eval_chunk, loss=loss)


def loss_of(task: str) -> Loss:
    """The per-sample loss of a task.

    >>> loss_of("regression"), loss_of("classification")
    ('squared', 'cross_entropy')
    """
    return "squared" if task == "regression" else "cross_entropy"


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``method.precision`` on ``device`` (None: plain fp32).

    ``auto``: bf16 on a CUDA device that supports it, fp32 otherwise (CPU autocast is slower
    than fp32 for these models and gains no memory that matters); ``bf16``: bf16 autocast
    on any device; ``fp32``: off.

    >>> resolve_precision("auto", torch.device("cpu")) is None
    True
    >>> resolve_precision("bf16", torch.device("cpu"))
    torch.bfloat16
    """
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None
