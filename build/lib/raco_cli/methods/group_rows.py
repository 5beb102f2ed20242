"""A sweep group's training rows, packed once, and its clipped gradient sums: what both ways of
computing a group's step read and return, torch's gather and products
(:mod:`raco_cli.methods.batched`, on an accelerator) and the compiled data pass
(:mod:`raco_cli.methods.batched_scan`, on the CPU)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raco_cli.data.types import TabularData
from raco_cli.privacy.preprocessing import standardize_columns


class GroupRows:
    """The training rows of a group, packed once as ``X | onehot(y) | norm | onehot(cell)``
    with a zero pad row at index n (what padded sample slots gather).

    ``norm`` is ``sqrt(|x|^2 + 1)`` (the row norm of the closed-form linear gradient), or, when
    the runs standardise the first m columns each their own way, ``|x[m:]|^2`` (each run adds
    its own standardised part).  Rows with a non-finite feature are neutralised as
    :class:`raco_cli.methods.training.Rows` does: zero features, infinite norm, no cell (unless
    ``neutralise_cells`` is false).
    """

    def __init__(
        self, data: TabularData, idx: np.ndarray, cells: np.ndarray, scalings: Sequence[tuple[np.ndarray, np.ndarray] | None],
        device: torch.device, *, n_cells: int, neutralise_cells: bool = True,
    ) -> None:
        n = len(idx)
        X = torch.as_tensor(np.asarray(data.X[idx]).reshape(n, -1), dtype=torch.float32, device=device)
        self.m = len(scalings[0][0]) if scalings and scalings[0] is not None else 0
        m = self.m
        # a NaN in a publicly scaled column stays NaN after standardising; an inf is clipped
        bad = ~torch.isfinite(X[:, m:]).all(dim=1, keepdim=True)
        if m:
            bad |= torch.isnan(X[:, :m]).any(dim=1, keepdim=True)
        X = torch.where(bad, torch.zeros_like(X), X)
        rest = X[:, m:]
        sq = (rest * rest).sum(dim=1, keepdim=True)
        norm = torch.where(bad, torch.full_like(sq, float("inf")), sq if m else torch.sqrt(sq + 1.0))
        y = torch.as_tensor(data.y[idx], dtype=torch.long, device=device)
        onehot = nn.functional.one_hot(y, data.n_classes).float()
        cellhot = nn.functional.one_hot(torch.as_tensor(cells, dtype=torch.long, device=device), n_cells).float() if n_cells else X[:, :0]
        if neutralise_cells:  # (DP-FERMI keeps the group of such a row, as its one-run loop does)
            cellhot = cellhot * ~bad
        packed = torch.cat([X, onehot, norm, cellhot], dim=1)
        self.packed = torch.cat([packed, torch.zeros_like(packed[:1])])  # the pad row, index n
        # the gathered rows of a step (R x 2B rows: ~80 MB for 160 runs on Adult) go into one
        # reused buffer: a fresh array that large is mapped anew and page-faulted every step,
        # which was about a third of the gather
        self._buffer = self.packed.new_empty((0, self.packed.shape[1]))
        self.n, self.d, self.K, self.Q, self.device = n, X.shape[1], data.n_classes, n_cells, device
        if m:
            self.mean = np.stack([s[0] for s in scalings])[:, None, :]  # type: ignore[index]
            self.std = np.stack([s[1] for s in scalings])[:, None, :]  # type: ignore[index]

    def gather(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        """The rows of ``idx`` (R, L) (``n`` = pad): ``X`` (R, L, d), ``onehot`` (R, L, K),
        ``xnorm`` (R, L), ``cellhot`` (R, L, Q) and ``valid`` (R, L) bool.

        The returned tensors are views of a buffer the next ``gather`` overwrites: use them
        within the step."""
        R, L = idx.shape
        if len(self._buffer) < R * L:  # grown to the largest step so far (+1/8: batch sizes vary)
            self._buffer = self.packed.new_empty((R * L + R * L // 8, self.packed.shape[1]))
        P = torch.index_select(self.packed, 0, torch.as_tensor(idx.reshape(-1), device=self.device), out=self._buffer[: R * L])
        P = P.view(R, L, -1)
        d, K, m = self.d, self.K, self.m
        norm = P[..., d + K]
        if m:  # each run's standardisation of its rows (as dp_standardize writes them)
            num = torch.from_numpy(standardize_columns(P[..., :m].cpu().numpy(), self.mean, self.std)).to(P.device)
            num = torch.where(torch.isinf(norm)[..., None], torch.zeros_like(num), num)  # neutralised rows stay zero
            P[..., :m] = num
            norm = torch.sqrt(norm + (num * num).sum(dim=-1) + 1.0)
        valid = torch.as_tensor(idx < self.n, device=P.device)
        return {"X": P[..., :d], "onehot": P[..., d : d + K], "xnorm": norm, "cellhot": P[..., d + K + 1 : d + K + 1 + self.Q],
                "valid": valid}


@dataclass
class GroupSum:
    """Clipped per-sample gradient sums of R runs (:class:`raco_cli.methods.gradients.ClippedSum`
    per run), statistics (R,)."""

    grad_w: torch.Tensor  # (R, K, d)
    grad_b: torch.Tensor  # (R, K)
    clipped: torch.Tensor
    norm_sum: torch.Tensor
    nonfinite: torch.Tensor
