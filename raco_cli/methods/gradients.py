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
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _stats(norms: torch.Tensor, clip_norm: float | None, finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


class LinearEngine:
    """Closed-form clipped per-sample gradient sums for a linear softmax model."""

    def __init__(self, layer: nn.Linear) -> None:
        self.layer = layer
        self.params = [layer.weight, layer.bias]

    def logits(self, X: torch.Tensor) -> torch.Tensor:
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
    ) -> ClippedSum:
        """Clipped sum; ``onehot``/``xnorm`` (``sqrt(|x|^2 + 1)``) may be precomputed per row."""
        X = X.flatten(1)
        z = self.logits(X) if logits is None else logits
        if onehot is None:
            if y is None:
                raise ValueError("clipped_sum needs y or onehot")
            onehot = nn.functional.one_hot(y, z.shape[1]).to(z.dtype)
        g = row_softmax(z) - onehot
        if c is not None:
            pt = row_softmax(z, temperature)
            g = g + (reg_scale * temperature) * pt * (c - (c * pt).sum(dim=1, keepdim=True))
        if xnorm is None:
            xnorm = torch.sqrt((X * X).sum(dim=1) + 1.0)
        norms = g.norm(dim=1) * xnorm
        finite = torch.isfinite(norms)
        # non-finite rows: factor 0 and nan_to_num drop them without a device sync
        gs = torch.nan_to_num(g * clip_factors(norms, clip_norm, finite)[:, None], nan=0.0, posinf=0.0, neginf=0.0)
        clipped, norm_sum, nonfinite = _stats(norms, clip_norm, finite)
        # a dropped row's zero factor times an inf/NaN feature is NaN: clear those features too
        X = torch.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0)
        return ClippedSum(grads=[gs.t() @ X, gs.sum(dim=0)], clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite)


class FunctionalEngine:
    """Clipped per-sample gradient sums for any model, via torch.func over micro-batches."""

    def __init__(self, model: nn.Module, *, micro_batch: int) -> None:
        self.model = model
        self.micro_batch = int(micro_batch)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in model.named_parameters() if p.requires_grad]

    def logits(self, X: torch.Tensor) -> torch.Tensor:
        return self.model(X)

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
        from torch.func import functional_call, grad, vmap

        params = {n: p.detach() for n, p in zip(self.names, self.params)}
        buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        has_c = c is not None

        def objective(p, x, t, ci):  # one row; batch dims added for the module
            z = functional_call(self.model, (p, buffers), (x.unsqueeze(0),))
            loss = nn.functional.cross_entropy(z, t.unsqueeze(0))
            if has_c:
                loss = loss + reg_scale * (ci * torch.softmax(temperature * z, dim=1)[0]).sum()
            return loss

        per_sample = vmap(grad(objective), in_dims=(None, 0, 0, 0))
        total = [torch.zeros_like(p) for p in self.params]
        zero = torch.zeros((), device=X.device)
        clipped, norm_sum, nonfinite = zero.long(), zero, zero.long()
        cc = c if has_c else torch.zeros(len(y), 1, device=X.device)
        for start in range(0, len(y), self.micro_batch):
            sl = slice(start, start + self.micro_batch)
            g = per_sample(params, X[sl], y[sl], cc[sl])
            norms = torch.sqrt(sum((g[n].flatten(1) ** 2).sum(dim=1) for n in self.names))
            finite = torch.isfinite(norms)
            factors = clip_factors(norms, clip_norm, finite)
            for acc, n in zip(total, self.names):
                acc += torch.tensordot(factors, torch.nan_to_num(g[n], nan=0.0, posinf=0.0, neginf=0.0), dims=1)
            a, b, d = _stats(norms, clip_norm, finite)
            clipped, norm_sum, nonfinite = clipped + a, norm_sum + b, nonfinite + d
        return ClippedSum(grads=total, clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite)


def engine_for(model: nn.Module, *, micro_batch: int, prefer_closed_form: bool = True):
    """The fastest correct engine for a model."""
    from raco_cli.models import linear_layer

    layer = linear_layer(model) if prefer_closed_form else None
    if layer is not None:
        return LinearEngine(layer)
    return FunctionalEngine(model, micro_batch=micro_batch)
