"""The data pass of a batched SGDA step on the CPU, compiled: every run's rows read in row order.

A step of R runs reads R x (2 x ~B) Poisson rows; gathered run by run
(:meth:`raco_cli.methods.batched.GroupRows.gather`), each read is a random access to the
packed table, and the step waits on memory (docs/batched.md, "Two more experiments": a
compiled kernel reading the rows run by run took as long as torch's gather and products).
With R x 2B far above n every row is sampled by several runs, so here the step's samples are
inverted (for each row, which runs sampled it, as histogram or gradient row) and the table is
read once, in order, per pass:

1. :meth:`Scan.histograms` (constrained runs): each histogram row's tempered softmax added to
   its cell (paper eq. 8, :func:`raco_cli.methods.sgda.batched._histograms`), and the logits
   of each gradient row kept;
2. :meth:`Scan.clipped_sums`: each gradient row's logit gradient with the regularizer
   (eq. 10), its norm, clip factor and contribution to the sums,
   :func:`raco_cli.methods.batched.clipped_sums`.

A run's rows are visited in increasing row order, as in its own sample, so each run's sums
add the same terms in the same order as a loop over its sample; the dot products and row
sums may be reassociated (``fastmath`` with ``reassoc`` and ``contract`` only: NaN and inf
keep their IEEE meaning, so non-finite rows are still found and dropped).  The results equal
the torch path to float32 rounding: tests/unit/methods/test_batched.py runs the batched
equivalence tests (each run equal to the run alone at 1e-6) on this pass too.

numba compiles the kernels on first use (a few seconds, then cached in ``__pycache__``); this
module, and numba with it, is imported only when a group trains on the CPU
(:func:`raco_cli.methods.sgda.batched.run_core`): ``raco --help`` and the one-run path never
import it.  Groups the kernels do not cover (``dual=hard``, per-run DP standardisation,
accelerators) keep the torch path.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from raco_cli.methods.batched import GroupRows, GroupSum

_FASTMATH = {"reassoc", "contract"}  # vectorised dot products; no nnan / ninf


class Scan:
    """One group's compiled data pass; :meth:`sample` each step, then :meth:`histograms`
    (constrained) and :meth:`clipped_sums`."""

    def __init__(self, rows: GroupRows, R: int) -> None:
        self.P = rows.packed.numpy()  # (n + 1, D): X | onehot | norm | cells, pad row n
        self.n, self.d, self.K, self.Q, self.R = rows.n, rows.d, rows.K, rows.Q, R
        self.Z = np.empty((R, 0, self.K), dtype=np.float32)
        self.order = self.starts = self.entries = np.empty(0, dtype=np.int64)
        self.shared = False  # sampling=shared: the gradient rows are the histogram's too
        self.width = 1  # bits of the slot in an entry's code

    def sample(self, hist: tuple[np.ndarray, np.ndarray] | None, grad: tuple[np.ndarray, np.ndarray], *, shared: bool = False) -> None:
        """The step's samples: ``(idx (R, L), lengths (R,))`` of the histogram rows (None:
        unconstrained, or ``shared``: the gradient rows are the histogram's) and of the
        gradient rows."""
        self.shared = shared
        idx_h, len_h = hist if hist is not None else (np.zeros((self.R, 0), dtype=np.int64), np.zeros(self.R, dtype=np.int64))
        idx_g, len_g = grad
        self.width = max(idx_h.shape[1], idx_g.shape[1], 1).bit_length()  # bits of a slot
        self.order, self.starts, self.entries = _invert(idx_h, len_h, idx_g, len_g, self.n, self.width)
        if self.Z.shape[1] < idx_g.shape[1]:
            self.Z = np.empty((self.R, idx_g.shape[1] + idx_g.shape[1] // 8, self.K), dtype=np.float32)

    def histograms(self, W: torch.Tensor, b: torch.Tensor, temperature: np.ndarray) -> torch.Tensor:
        """Exact histograms (R, Q, K) float64 of the histogram rows under each run's tempered
        softmax (``temperature`` (R,)); keeps the gradient rows' logits for :meth:`clipped_sums`."""
        H = np.zeros((self.R, self.Q, self.K))
        _histograms(self.P, self.order, self.starts, self.entries, self.width, W.numpy(), b.numpy(),
                    temperature.astype(np.float32), self.d, self.K, self.Q, H, self.Z, True, self.shared)
        return torch.from_numpy(H)

    def logits(self, W: torch.Tensor, b: torch.Tensor) -> None:
        """The gradient rows' logits only (unconstrained runs: no histogram)."""
        _histograms(self.P, self.order, self.starts, self.entries, self.width, W.numpy(), b.numpy(),
                    np.ones(self.R, dtype=np.float32), self.d, self.K, self.Q, np.zeros((self.R, self.Q, self.K)), self.Z, False, False)

    def clipped_sums(self, weights: np.ndarray | None, reg_temp: np.ndarray, temperature: np.ndarray,
                     clip: np.ndarray | None) -> GroupSum:
        """:func:`raco_cli.methods.batched.clipped_sums` of the gradient rows: ``weights``
        (R, Q, K) the regularizer's cell weights (None: no regularizer), ``reg_temp`` (R,)
        ``q|D| tau`` per run, ``temperature`` (R,), ``clip`` (R,) norms (None: no clipping)."""
        R, K, d = self.R, self.K, self.d
        GW, Gb = np.zeros((R, K, d), dtype=np.float32), np.zeros((R, K), dtype=np.float32)
        clipped, nonfinite = np.zeros(R, dtype=np.int64), np.zeros(R, dtype=np.int64)
        norm_sum = np.zeros(R)
        _clipped_sums(
            self.P, self.order, self.starts, self.entries, self.width, self.Z,
            np.zeros((R, self.Q, K), dtype=np.float32) if weights is None else weights.astype(np.float32), weights is not None,
            reg_temp.astype(np.float32), temperature.astype(np.float32),
            np.ones(R, dtype=np.float32) if clip is None else clip.astype(np.float32), clip is not None,
            self.d, self.K, self.Q, GW, Gb, clipped, norm_sum, nonfinite,
        )
        return GroupSum(grad_w=torch.from_numpy(GW), grad_b=torch.from_numpy(Gb), clipped=torch.from_numpy(clipped),
                        norm_sum=torch.from_numpy(norm_sum.astype(np.float32)), nonfinite=torch.from_numpy(nonfinite))


# --- the kernels ------------------------------------------------------------------------------
# An entry codes (run r, kind s, slot) as ((2 r + s) << width) | slot: s = 0 a histogram row,
# s = 1 a gradient row, at that slot of run r's sample.


@njit(cache=True)
def _invert(idx_h, len_h, idx_g, len_g, n, width):
    """Counting sort of every (run, kind, slot) by its row: ``order``, the sampled rows in
    increasing order, ``starts`` (n + 1,) and ``entries`` (row i's entries are
    ``entries[starts[i]:starts[i + 1]]``, runs in increasing order)."""
    R = idx_g.shape[0]
    starts = np.zeros(n + 1, dtype=np.int64)
    for r in range(R):
        for slot in range(len_h[r]):
            starts[idx_h[r, slot] + 1] += 1
        for slot in range(len_g[r]):
            starts[idx_g[r, slot] + 1] += 1
    for i in range(1, n + 1):
        starts[i] += starts[i - 1]
    sampled = 0
    for i in range(n):
        if starts[i + 1] > starts[i]:
            sampled += 1
    order = np.empty(sampled, dtype=np.int64)  # the rows some run sampled, increasing
    sampled = 0
    for i in range(n):
        if starts[i + 1] > starts[i]:
            order[sampled] = i
            sampled += 1
    entries = np.empty(starts[n], dtype=np.int64)
    fill = starts[:n].copy()
    for r in range(R):
        for slot in range(len_h[r]):
            i = idx_h[r, slot]
            entries[fill[i]] = ((r * 2) << width) | slot
            fill[i] += 1
        for slot in range(len_g[r]):
            i = idx_g[r, slot]
            entries[fill[i]] = ((r * 2 + 1) << width) | slot
            fill[i] += 1
    return order, starts, entries


@njit(cache=True, fastmath=_FASTMATH)
def _softmax_into(out, z, tau, K):
    """``softmax(tau z)`` into out (K,), torch's max-shifted form."""
    m = -np.inf
    for k in range(K):
        out[k] = tau * z[k]
        if out[k] > m or np.isnan(out[k]):
            m = out[k]
    total = np.float32(0.0)
    for k in range(K):
        out[k] = np.exp(out[k] - m)
        total += out[k]
    for k in range(K):
        out[k] = out[k] / total


@njit(cache=True, fastmath=_FASTMATH)
def _histograms(P, order, starts, entries, width, W, b, tau, d, K, Q, H, Z, histogram, shared):
    z = np.empty(K, dtype=np.float32)
    p = np.empty(K, dtype=np.float32)
    for i in order:
        for t in range(starts[i], starts[i + 1]):
            code = entries[t]
            slot = code & ((1 << width) - 1)
            rs = code >> width
            r, s = rs >> 1, rs & 1
            if K == 2:  # both classes in one pass over the row (most tables are binary)
                z0, z1 = b[r, 0], b[r, 1]
                for j in range(d):
                    x = P[i, j]
                    z0 += W[r, 0, j] * x
                    z1 += W[r, 1, j] * x
                z[0], z[1] = z0, z1
            else:
                for k in range(K):
                    acc = b[r, k]
                    for j in range(d):
                        acc += W[r, k, j] * P[i, j]
                    z[k] = acc
            if s == 1:
                for k in range(K):
                    Z[r, slot, k] = z[k]
            if histogram and (s == 0 or shared):
                _softmax_into(p, z, tau[r], K)
                for q in range(Q):
                    c = P[i, d + K + 1 + q]
                    if c != 0.0:
                        for k in range(K):
                            if np.isfinite(p[k]):  # a non-finite rate counts 0 (core._histogram)
                                H[r, q, k] += c * p[k]


@njit(cache=True, fastmath=_FASTMATH)
def _clipped_sums(P, order, starts, entries, width, Z, weights, regularized, reg_temp, tau, clip, clipping, d, K, Q,
                  GW, Gb, clipped, norm_sum, nonfinite):
    p = np.empty(K, dtype=np.float32)
    pt = np.empty(K, dtype=np.float32)
    c = np.empty(K, dtype=np.float32)
    g = np.empty(K, dtype=np.float32)
    for i in order:
        for t in range(starts[i], starts[i + 1]):
            code = entries[t]
            rs = code >> width
            r, s = rs >> 1, rs & 1
            if s == 0:
                continue
            slot = code & ((1 << width) - 1)
            _softmax_into(p, Z[r, slot], np.float32(1.0), K)
            for k in range(K):
                g[k] = p[k] - P[i, d + k]  # p - e_y
            if regularized:
                if tau[r] == 1.0:
                    for k in range(K):
                        pt[k] = p[k]
                else:
                    _softmax_into(pt, Z[r, slot], tau[r], K)
                inner = np.float32(0.0)
                for k in range(K):
                    c[k] = 0.0
                    for q in range(Q):
                        c[k] += P[i, d + K + 1 + q] * weights[r, q, k]
                    inner += c[k] * pt[k]
                for k in range(K):
                    g[k] = g[k] + reg_temp[r] * pt[k] * (c[k] - inner)
            sq = np.float32(0.0)
            for k in range(K):
                sq += g[k] * g[k]
            norm = np.sqrt(sq) * P[i, d + K]
            if clipping and norm > clip[r]:  # (an infinite norm counts as clipped, as in torch)
                clipped[r] += 1
            if not np.isfinite(norm):  # dropped: factor 0
                nonfinite[r] += 1
                continue
            norm_sum[r] += norm
            f = min(np.float32(1.0), clip[r] / (norm + np.float32(1e-12))) if clipping else np.float32(1.0)
            if K == 2:
                f0, f1 = g[0] * f, g[1] * f
                Gb[r, 0] += f0
                Gb[r, 1] += f1
                for j in range(d):
                    x = P[i, j]
                    GW[r, 0, j] += f0 * x
                    GW[r, 1, j] += f1 * x
            else:
                for k in range(K):
                    fg = g[k] * f
                    Gb[r, k] += fg
                    for j in range(d):
                        GW[r, k, j] += fg * P[i, j]
