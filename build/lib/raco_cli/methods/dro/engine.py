"""Per-record loss gradients for the DRO methods, combined over parameter points, clipped, summed.

Every gradient the DRO methods release is a sum over a Poisson batch of per-record vectors

    v_i = sum_k w_{k,i} grad l_i(theta_k)          (l_i: cross-entropy of record i)

with one term (a refresh: ``w_i = (psi*)'(u_i)`` at the current parameters) or two (a SPIDER
correction: the weighted gradient at theta_t minus the weighted gradient at theta_{t-1} of the
*same* record).  Each record's v_i is clipped to C on its own and then summed
(``sum_i clip(v_i, C)``), so adding or removing one record moves the sum by at most C: the
sensitivity the Gaussian noise is calibrated to.  (The paper's Algorithm 2 clips the batch
*mean*, whose sensitivity is 2C rather than C / N; :func:`clip_rows` and the engines never do.)

* :class:`LinearRecordEngine`: logistic regression in closed form.  ``grad l_i(theta) =
  (softmax(z_i) - e_{y_i}) [x_i, 1]^T``, so every v_i is ``G_i [x_i, 1]^T`` with
  ``G_i = sum_k w_{k,i} (softmax(z_{k,i}) - e_{y_i})`` and ``|v_i| = |G_i| sqrt(|x_i|^2 + 1)``.
* :class:`FunctionalRecordEngine`: any model, per-record gradients with ``torch.func``
  (vmap of grad) over micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from raco_cli.methods.gradients import ClippedSum, clip_factors, clip_stats, resolve_precision

Point = list[torch.Tensor] | None  # parameter values, in engine.params order (None: the current ones)
Term = tuple[Point, torch.Tensor]  # (parameters theta_k, per-record weights w_k (b,))


def row_norms(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-row L2 norms over ``parts`` (each (b, ...)), summed in float64.

    A DRO weight ``exp((l_i - eta) / lambda)`` reaches e^60 (``MAX_EXPONENT``): its row's squared
    float32 norm overflows to inf, and a non-finite row is dropped from the clipped sum, the rows
    of highest loss first (digits-ST MLP, 186 186 rows dropped in one run).  In float64 the norm
    stays finite and the row is clipped to C like any other.

    >>> big = 2.0**80  # (3 big, 4 big) squares to 25 big^2 = 3e49: inf in float32
    >>> row_norms([torch.tensor([[3 * big, 0.0]]), torch.tensor([[4 * big]])]).item() == 5 * big
    True
    """
    return torch.sqrt(sum((p.flatten(1).double() ** 2).sum(dim=1) for p in parts))  # type: ignore[arg-type]


def clip_rows(rows: torch.Tensor, clip_norm: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_i clip(rows_i, C)`` of per-record vectors ``rows`` (b, m) and the clipped count.

    Non-finite rows count 0 (their sensitivity would be unbounded).

    >>> s, c = clip_rows(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), 1.0)
    >>> [round(v, 4) for v in s.tolist()], int(c)
    ([0.9, 1.2], 1)
    """
    norms = row_norms([rows])
    finite = torch.isfinite(norms)
    factors = clip_factors(norms, clip_norm, finite).to(rows.dtype)
    total = torch.nan_to_num(rows * factors[:, None], nan=0.0, posinf=0.0, neginf=0.0).sum(dim=0)
    clipped = (norms > clip_norm).sum() if clip_norm is not None else torch.zeros((), dtype=torch.long, device=rows.device)
    return total, clipped


@dataclass
class LinearRecordEngine:
    """Closed-form per-record gradients of a linear softmax model (module docstring)."""

    layer: nn.Linear
    eval_chunk: int = 8192

    @property
    def params(self) -> list[nn.Parameter]:
        return [cast(nn.Parameter, self.layer.weight), cast(nn.Parameter, self.layer.bias)]

    def snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def _weights(self, point: Point) -> tuple[torch.Tensor, torch.Tensor]:
        W, b = point if point is not None else (self.layer.weight, self.layer.bias)
        return W.detach(), b.detach()

    def logits(self, X: torch.Tensor, point: Point = None) -> torch.Tensor:
        W, b = self._weights(point)
        return torch.addmm(b, X.flatten(1), W.t())

    @torch.no_grad()
    def losses(self, X: torch.Tensor, y: torch.Tensor, point: Point = None) -> torch.Tensor:
        return nn.functional.cross_entropy(self.logits(X, point), y, reduction="none")

    @torch.no_grad()
    def clipped_sum(self, X: torch.Tensor, y: torch.Tensor, terms: Sequence[Term], clip_norm: float | None) -> ClippedSum:
        X = X.flatten(1)
        onehot = nn.functional.one_hot(y, self.layer.out_features).to(X.dtype)
        G = torch.zeros(len(y), self.layer.out_features, dtype=X.dtype, device=X.device)
        for point, w in terms:
            G = G + w.to(X.dtype)[:, None] * (torch.softmax(self.logits(X, point), dim=1) - onehot)
        Xc = torch.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0)
        xnorm = torch.where(torch.isfinite(X).all(dim=1), torch.sqrt((Xc * Xc).sum(dim=1) + 1.0), float("inf"))
        norms = row_norms([G]) * xnorm.double()
        finite = torch.isfinite(norms)
        Gs = torch.nan_to_num(G * clip_factors(norms, clip_norm, finite).to(G.dtype)[:, None], nan=0.0, posinf=0.0, neginf=0.0)
        clipped, norm_sum, nonfinite = clip_stats(norms, clip_norm, finite)
        norm_sum = norm_sum.to(X.dtype)
        return ClippedSum(grads=[Gs.t() @ Xc, Gs.sum(dim=0)], clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite)


class FunctionalRecordEngine:
    """Per-record gradients of any model with ``torch.func`` over micro-batches of
    ``micro_batch`` rows (memory bounded; the sum does not depend on the chunking).

    Models with batch statistics would break per-record clipping; the models of
    :mod:`raco_cli.models` have none (GroupNorm)."""

    def __init__(self, model: nn.Module, *, micro_batch: int, amp_dtype: torch.dtype | None = None, eval_chunk: int = 8192) -> None:
        self.model, self.micro_batch, self.amp_dtype, self.eval_chunk = model, int(micro_batch), amp_dtype, int(eval_chunk)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in model.named_parameters() if p.requires_grad]

    def snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def _dict(self, point: Point) -> dict[str, torch.Tensor]:
        values = point if point is not None else [p.detach() for p in self.params]
        return dict(zip(self.names, values))

    def _forward(self, params: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
        from torch.func import functional_call

        buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        with torch.autocast(device_type=X.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            z = functional_call(self.model, (params, buffers), (X,))
        return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z

    @torch.no_grad()
    def logits(self, X: torch.Tensor, point: Point = None) -> torch.Tensor:
        params = self._dict(point)
        return torch.cat([self._forward(params, X[s : s + self.eval_chunk]) for s in range(0, len(X), self.eval_chunk)]) if len(X) else self._forward(params, X)

    @torch.no_grad()
    def losses(self, X: torch.Tensor, y: torch.Tensor, point: Point = None) -> torch.Tensor:
        return nn.functional.cross_entropy(self.logits(X, point), y, reduction="none")

    def clipped_sum(self, X: torch.Tensor, y: torch.Tensor, terms: Sequence[Term], clip_norm: float | None) -> ClippedSum:
        if clip_norm is None:
            return self._plain_sum(X, y, terms)
        from torch.func import grad, vmap

        def row_loss(p: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(self._forward(p, x.unsqueeze(0)), t.unsqueeze(0))

        per_record = vmap(grad(row_loss), in_dims=(None, 0, 0))
        points = [(self._dict(point), w) for point, w in terms]
        total = [torch.zeros_like(p) for p in self.params]
        zero = torch.zeros((), device=X.device)
        clipped, norm_sum, nonfinite = zero.long(), zero, zero.long()
        for start in range(0, len(y), self.micro_batch):
            sl = slice(start, start + self.micro_batch)
            v: dict[str, torch.Tensor] = {}
            for params, w in points:
                g = per_record(params, X[sl], y[sl])
                ws = w[sl].to(torch.float32)
                for n in self.names:
                    term = ws.view(-1, *([1] * (g[n].dim() - 1))) * g[n].float()
                    v[n] = term if n not in v else v[n] + term
            norms = row_norms([v[n] for n in self.names])
            finite = torch.isfinite(norms)
            factors = clip_factors(norms, clip_norm, finite).float()
            for acc, n in zip(total, self.names):
                acc += torch.tensordot(factors, torch.nan_to_num(v[n], nan=0.0, posinf=0.0, neginf=0.0), dims=1)
            a, b, c = clip_stats(norms, clip_norm, finite)
            clipped, norm_sum, nonfinite = clipped + a, norm_sum + b.float(), nonfinite + c
        return ClippedSum(grads=total, clipped=clipped, norm_sum=norm_sum, nonfinite=nonfinite)

    def _plain_sum(self, X: torch.Tensor, y: torch.Tensor, terms: Sequence[Term]) -> ClippedSum:
        """No clipping (non-private references): ``grad sum_k sum_i w_{k,i} l_i(theta_k)``, one
        ordinary backward per term and micro-batch; rows with a non-finite loss are dropped."""
        total = [torch.zeros_like(p) for p in self.params]
        nonfinite = torch.zeros((), dtype=torch.long, device=X.device)
        for point, w in terms:
            values = [t.detach().clone().requires_grad_(True) for t in (point if point is not None else self.params)]
            params = dict(zip(self.names, values))
            for start in range(0, len(y), self.micro_batch):
                sl = slice(start, start + self.micro_batch)
                with torch.enable_grad():
                    per_row = w[sl].to(torch.float32) * nn.functional.cross_entropy(self._forward(params, X[sl]), y[sl], reduction="none")
                    finite = torch.isfinite(per_row)
                    grads = torch.autograd.grad(torch.where(finite, per_row, torch.zeros_like(per_row)).sum(), values)
                for acc, g in zip(total, grads):
                    acc += torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
                nonfinite = nonfinite + (~finite).sum()
        nan = torch.full((), float("nan"), device=X.device)
        return ClippedSum(grads=total, clipped=torch.zeros_like(nonfinite), norm_sum=nan, nonfinite=nonfinite)


RecordEngine = LinearRecordEngine | FunctionalRecordEngine


def record_engine(model: nn.Module, *, micro_batch: int, precision: str = "fp32", device: torch.device | None = None) -> RecordEngine:
    """Closed form for logistic regression, ``torch.func`` otherwise."""
    from raco_cli.models import linear_layer

    layer = linear_layer(model)
    if layer is not None:
        return LinearRecordEngine(layer)
    amp = resolve_precision(precision, device or torch.device("cpu"))
    return FunctionalRecordEngine(model, micro_batch=micro_batch, amp_dtype=amp, eval_chunk=min(8192, 4 * micro_batch))
