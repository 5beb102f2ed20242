"""The data pass of a batched SGDA step on the CPU, compiled: every run's rows read in row order.

A step of R runs reads R x (2 x ~B) Poisson rows; gathered run by run
(:meth:`raco_cli.methods.batched.GroupRows.gather`), each read is a random access to the
packed table, and the step waits on memory (docs/batched.md, "Two more experiments": a
compiled kernel reading the rows run by run took as long as torch's gather and products).
With R x 2B far above n every row is sampled by several runs, so here the step's samples are
inverted (for each row, which runs sampled it, as histogram or gradient row) and the table is
read once, in order, per pass:

1. :meth:`Scan.logits`: every entry's logits (the dot products), an entry being one (run,
   sample, row) of the step; for two classes the margin alone (:func:`margin_weights`);
2. between the passes, vectorised in numpy: every entry's softmax and tempered softmax
   (numpy's SIMD exp; a scalar exp per entry inside the kernels was a third of the step), and
   (constrained runs, :meth:`Scan.histograms`) each histogram row's tempered softmax, or its
   arg-max one-hot under ``dual=hard``, added to its cell (paper eq. 8,
   :func:`raco_cli.methods.sgda.batched._histograms`);
3. :meth:`Scan.clipped_sums`: each gradient row's logit gradient with the regularizer
   (eq. 10), its norm, clip factor and contribution to the sums,
   :func:`raco_cli.methods.batched.clipped_sums`; for DP-FERMI also its W player's clipped
   sums (:meth:`Scan.w_clipped_sums`).

Before the passes, :meth:`Scan.positions` draws the step's Poisson samples as
:func:`raco_cli.privacy.mechanisms.poisson_positions_many` does, its gaps summed by the
compiled :func:`gap_sums` (numpy's cumsum adds one entry after another, one row at a time).

A run's rows are visited in increasing row order, as in its own sample, so each run's sums
add the same terms in the same order as a loop over its sample; the dot products and row
sums may be reassociated (``fastmath`` with ``reassoc`` and ``contract`` only: NaN and inf
keep their IEEE meaning, so non-finite rows are still found and dropped).  The softmax is
torch's max-shifted form, so a non-finite logit gives NaN rates (counted 0 in a histogram)
as in torch.  The results equal the torch path to float32 rounding:
tests/unit/methods/test_batched.py runs the batched equivalence tests (each run equal to the
run alone at 1e-6) on this pass too.

numba compiles the kernels on first use (a few seconds, then cached in ``__pycache__``); this
module, and numba with it, is imported only when a group trains on the CPU
(:func:`raco_cli.methods.sgda.batched.run_core`, :func:`raco_cli.methods.dp_fermi.fit_many`):
``raco --help`` and the one-run path never import it.  Per-run DP standardisation
(scope=model) is applied per entry once a step (:func:`_standardized_entries`); groups on an
accelerator keep the torch path (:func:`raco_cli.methods.batched.compiled_scan_applies`).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from raco_cli.methods.batched import GroupRows, GroupSum
from raco_cli.privacy.mechanisms import SecureUniforms, poisson_positions_many
from raco_cli.privacy.preprocessing import unit_columns

_FASTMATH = {"reassoc", "contract"}  # vectorised dot products; no nnan / ninf


class Scan:
    """One group's compiled data pass; :meth:`sample` each step, then :meth:`histograms`
    (constrained) or :meth:`logits`, then :meth:`clipped_sums`."""

    def __init__(self, rows: GroupRows, R: int) -> None:
        self.P = rows.packed.numpy()  # (n + 1, D): X | onehot | norm | cells, pad row n
        self.n, self.d, self.K, self.Q, self.R = rows.n, rows.d, rows.K, rows.Q, R
        # each row's cell (-1: none, a neutralised row), read once: the cell columns are one-hot
        # or zero, so a row's histogram term is its rates in that cell, and its regularizer
        # weights that cell's (what torch's products with the one-hot columns give)
        cells = self.P[:, self.d + self.K + 1 : self.d + self.K + 1 + self.Q]
        if not (np.isin(cells, (0.0, 1.0)).all() and (cells.sum(axis=1) <= 1.0).all()):
            raise ValueError("the packed cell columns must be one-hot or zero rows")
        self.cell = np.full(len(cells), -1, dtype=np.int64)
        if self.Q:
            self.cell = np.where(cells.any(axis=1), cells.argmax(axis=1), -1).astype(np.int64)
        self.order = self.starts = self.mids = self.entries = np.empty(0, dtype=np.int64)
        self.Z = np.empty((self.K, 0), dtype=np.float32)  # (K, entries): each entry's logits, class-major
        self.pt: np.ndarray | None = None  # the entries' tempered softmax, set by histograms()
        self.p: np.ndarray | None = None  # the entries' softmax, set by clipped_sums()
        self.shared = False  # sampling=shared: the gradient rows are the histogram's too
        self.width = 1  # bits of the slot in an entry's code
        # per-run DP standardisation (scope=model, dataset.preprocessing=dp): each run's (mean,
        # std) (R, m) of the first m columns, applied to a row as the pass reads it for that run
        self.m = rows.m
        self.mean = rows.mean[:, 0, :].astype(np.float64) if rows.m else np.zeros((R, 0))
        self.std = rows.std[:, 0, :].astype(np.float64) if rows.m else np.ones((R, 0))
        # the run-independent part u of every row, once (as standardize_columns computes it),
        # and each entry's standardised columns and norm, written once a step before pass 1 and
        # read by both passes
        self.U = unit_columns(self.P[:, : self.m])
        self.XS = np.empty((0, self.m), dtype=np.float32)
        self.norms = np.empty(0, dtype=np.float32)

    def positions(self, sample_rate: float | np.ndarray, generators: list[np.random.Generator | SecureUniforms], *,
                  count: int) -> np.ndarray:
        """:func:`raco_cli.privacy.mechanisms.poisson_positions_many` of the group's rows, the gaps
        summed by :func:`gap_sums` (the same bits, about a third of numpy's floor, + 1 and cumsum time)."""
        return poisson_positions_many(self.n, sample_rate, generators, count=count, gap_sums=gap_sums)

    def sample(self, positions: np.ndarray, *, count: int, shared: bool = False) -> np.ndarray:
        """The step's samples, as :func:`raco_cli.privacy.mechanisms.poisson_positions_many`
        draws them (``count`` 2: each run's histogram sample, then its gradient sample; 1: the
        gradient sample alone, also the histogram's under ``shared``); returns the (R, count)
        sample sizes."""
        self.shared = shared
        self.order, self.starts, self.mids, self.entries, lengths, self.width = _invert(positions, self.n, count)
        if self.Z.shape[1] < len(self.entries):
            size = len(self.entries) + len(self.entries) // 8
            self.Z = np.zeros((self.K, size), dtype=np.float32)  # (a binary task's row 0 stays 0: margin_logits)
            self.XS, self.norms = np.empty((size, self.m), dtype=np.float32), np.empty(size if self.m else 0, dtype=np.float32)
        self.pt = self.p = None
        return lengths

    def logits(self, W: torch.Tensor, b: torch.Tensor) -> None:
        """Every entry's logits under its run's parameters (pass 1: the dot products)."""
        if self.m:
            _standardized_entries(self.P, self.U, self.order, self.starts, self.entries, self.width, self.d, self.K, self.m, self.mean,
                                  self.std, self.XS, self.norms)
        Wn, bn = W.numpy(), b.numpy()
        if self.K == 2:  # binary: the margin alone (the softmax is shift-invariant), half the products
            Wn, bn = margin_weights(Wn, bn)
        _logits(self.P, self.order, self.starts, self.entries, self.width, Wn, bn, self.d, Wn.shape[1], self.m, self.XS,
                self.Z[1:] if self.K == 2 else self.Z)

    def histograms(self, W: torch.Tensor, b: torch.Tensor, temperature: np.ndarray, *, hard: bool = False) -> torch.Tensor:
        """Exact histograms (R, Q, K) float64 of the histogram rows under each run's tempered
        softmax (``temperature`` (R,)), or of their arg-max one-hots (``hard``: ``dual=hard``);
        keeps every entry's tempered softmax for the regularizer of :meth:`clipped_sums`."""
        self.logits(W, b)
        self.pt = self._softmax(temperature)
        H = np.zeros((self.R, self.Q, self.K))
        _histograms(self.cell, self.order, self.starts, self.mids, self.entries, self.width, self._onehots() if hard else self.pt, self.K, H,
                    self.shared)
        return torch.from_numpy(H)

    def _onehots(self) -> np.ndarray:
        """Arg-max one-hots (K, entries) of every entry's logits, as ``one_hot(z.argmax())``: the
        first maximal class, a NaN counting as the maximum (numpy's argmax, as torch's)."""
        best = np.argmax(self.Z[:, : len(self.entries)], axis=0)
        return (best[None, :] == np.arange(self.K)[:, None]).astype(np.float32)

    def _softmax(self, temperature: np.ndarray | None) -> np.ndarray:
        """``softmax(tau_r z)`` (K, entries) of every entry, vectorised (numpy's SIMD exp; one
        scalar exp per entry inside the kernels was a third of the pass), in torch's
        max-shifted form: a non-finite logit gives NaN rates, as in torch."""
        E = len(self.entries)
        A = self.Z[:, :E].copy()
        if temperature is not None and np.any(temperature != 1.0):
            A *= temperature[0] if np.all(temperature == temperature[0]) else temperature.astype(np.float32)[self.entries >> (self.width + 1)]
        with np.errstate(invalid="ignore", over="ignore"):
            A -= A.max(axis=0)
            np.exp(A, out=A)
            A /= A.sum(axis=0)
        return A

    def clipped_sums(self, weights: np.ndarray | None, reg_temp: np.ndarray, temperature: np.ndarray,
                     clip: np.ndarray | None) -> GroupSum:
        """:func:`raco_cli.methods.batched.clipped_sums` of the gradient rows: ``weights``
        (R, Q, K) the regularizer's cell weights (None: no regularizer), ``reg_temp`` (R,)
        ``q|D| tau`` per run, ``temperature`` (R,), ``clip`` (R,) norms (None: no clipping)."""
        R, K, d = self.R, self.K, self.d
        p = self.pt if self.pt is not None and np.all(temperature == 1.0) else self._softmax(None)
        pt = self.pt if weights is not None and self.pt is not None else p
        self.p = p
        GW, Gb = np.zeros((R, K, d), dtype=np.float32), np.zeros((R, K), dtype=np.float32)
        clipped, nonfinite = np.zeros(R, dtype=np.int64), np.zeros(R, dtype=np.int64)
        norm_sum = np.zeros(R)
        weights32 = np.zeros((R, self.Q, K), dtype=np.float32) if weights is None else weights.astype(np.float32)
        clip32 = np.ones(R, dtype=np.float32) if clip is None else clip.astype(np.float32)
        if K == 2:
            # a binary row's logit gradient is (-a, a): p and pt sum to 1 and e_y is one-hot, so
            # p - e_y = (-(p_1 - y_1), p_1 - y_1) and the regularizer's pt * (c - <c, pt>) =
            # pt_0 pt_1 (c_0 - c_1, c_1 - c_0) (eq. 10); its clipped outer products sum to
            # (-S, S), and the kernel adds class 1's S alone (half the products)
            S, Sb = np.zeros((R, d), dtype=np.float32), np.zeros(R, dtype=np.float32)
            _binary_clipped_sums(self.P, self.cell, self.order, self.mids, self.starts, self.entries, self.width, p, pt, weights32,
                                 weights is not None, reg_temp.astype(np.float32), clip32, clip is not None, self.d, self.m, self.XS,
                                 self.norms, S, Sb, clipped, norm_sum, nonfinite)
            GW[:, 1], Gb[:, 1] = S, Sb
            np.negative(S, out=GW[:, 0])
            np.negative(Sb, out=Gb[:, 0])
        else:
            _clipped_sums(self.P, self.cell, self.order, self.mids, self.starts, self.entries, self.width, p, pt, weights32,
                          weights is not None, reg_temp.astype(np.float32), clip32, clip is not None, self.d, self.K, self.m, self.XS,
                          self.norms, GW, Gb, clipped, norm_sum, nonfinite)
        return GroupSum(grad_w=torch.from_numpy(GW), grad_b=torch.from_numpy(Gb), clipped=torch.from_numpy(clipped),
                        norm_sum=torch.from_numpy(norm_sum.astype(np.float32)), nonfinite=torch.from_numpy(nonfinite))

    def w_clipped_sums(self, dist: torch.Tensor, clip_w: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """DP-FERMI's W player on the gradient rows (:func:`raco_cli.methods.dp_fermi._w_gradient_sums`),
        from the softmax F that :meth:`clipped_sums` computed: each row's norm from ``dist``
        (R, k, l) (:func:`raco_cli.methods.dp_fermi.w_distances`), clipped to ``clip_w`` (R,);
        returns the clipped F summed per group (R, k, l) and over all rows (R, l), and the (R,)
        clip counts (:func:`raco_cli.methods.dp_fermi.w_gradient` makes the gradient of them)."""
        if self.p is None:
            raise RuntimeError("w_clipped_sums reads the softmax of clipped_sums: call it first")
        by_group, total = np.zeros(dist.shape, dtype=np.float32), np.zeros((self.R, dist.shape[2]), dtype=np.float32)
        clipped = np.zeros(self.R, dtype=np.int64)
        _w_sums(self.cell, self.order, self.mids, self.starts, self.entries, self.width, self.p, dist.numpy(), clip_w.astype(np.float32),
                by_group, total, clipped)
        return torch.from_numpy(by_group), torch.from_numpy(total), torch.from_numpy(clipped)


def margin_weights(W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A binary task's margin weights, ``W[:, 1] - W[:, 0]`` (R, 1, d) and ``b[:, 1] - b[:, 0]``
    (R, 1): :func:`_logits` under them writes ``z_1 - z_0`` into the logits' row 1 over a row 0
    of zeros, the logits shifted by ``-z_0``, one dot product instead of two.  The softmax,
    tempered or not, is shift-invariant and the arg-max keeps its first maximal class, so the
    rates are the logits' (to float32 rounding); a non-finite margin gives NaN rates, as
    non-finite logits do, and a NaN margin's arg-max is class 1, torch's when class 1's logit
    is NaN (when both are, torch's is class 0: a one-hot either way)."""
    return (W[:, 1] - W[:, 0])[:, None, :], (b[:, 1] - b[:, 0])[:, None]


# --- the kernels ------------------------------------------------------------------------------
# An entry codes (run r, kind s, slot) as ((2 r + s) << width) | slot: s = 0 a histogram row,
# s = 1 a gradient row, at that slot of run r's sample.


@njit(cache=True)  # no fastmath: the same IEEE operations, in the same order, as numpy's
def gap_sums(U):
    """In place, ``cumsum(floor(U) + 1)`` along each row of U (R, W) float64: the Poisson
    sampler's gaps summed into positions (:func:`raco_cli.privacy.mechanisms._cumulative_gaps`),
    bit for bit what numpy's ``floor``, ``+= 1`` and ``cumsum(out=U)`` give: each entry is
    floored, then 1 is added, then it is added to its row's running sum (from 0: 0 + the first
    entry is that entry exactly).  numpy's cumsum runs one row at a time, one dependent add
    after another; here the rows are summed side by side, column after column (R = 160 x 1 232
    uniforms: 0.75 -> 0.24 ms warm)."""
    R, W = U.shape
    total = np.zeros(R)
    for j in range(W):
        for r in range(R):
            total[r] = total[r] + (np.floor(U[r, j]) + 1.0)
            U[r, j] = total[r]
    return U


@njit(cache=True, inline="always")  # (inlined by numba: as a call, the sort took 9 % longer)
def _row_and_sample(position, n):
    """(row i, sample k) of a virtual position ``k * n + i``."""
    i, k = np.int64(position), 0
    while i >= n:  # (count <= 2: at most once; a division costs more)
        i -= n
        k += 1
    return i, k


@njit(cache=True)
def _invert(positions, n, count):
    """Counting sort of every (run, kind, slot) by its row, read from the runs' sampled
    positions (R, W) over ``count * n`` virtual rows (the k-th sample of run r at ``k * n + i``,
    increasing, then past the end): ``order``, the sampled rows in increasing order, ``starts``
    (n + 1,), ``mids`` (n,) and ``entries``: row i's histogram entries are
    ``entries[starts[i]:mids[i]]`` and its gradient entries ``entries[mids[i]:starts[i + 1]]``,
    runs in increasing order in each (a pass reads only its own kind: no branch on the kind,
    which the CPU mispredicted on every other entry); the sample sizes (R, count) and the bits
    of a slot."""
    R, total = positions.shape[0], count * n
    lengths = np.zeros((R, count), dtype=np.int64)
    starts = np.zeros(n + 1, dtype=np.int64)
    hist = np.zeros(n, dtype=np.int64)  # each row's histogram entries
    for r in range(R):
        for j in range(positions.shape[1]):
            if positions[r, j] >= total:  # increasing: the rest is past the end too
                break
            i, k = _row_and_sample(positions[r, j], n)
            lengths[r, k] += 1
            starts[i + 1] += 1
            if count == 2 and k == 0:
                hist[i] += 1
    longest, width = max(lengths.max(), 1), 0
    while longest > 0:
        width += 1
        longest >>= 1
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
    fill = starts[:n].copy()  # the next histogram entry of each row
    mids = starts[:n] + hist
    fill_gradient = mids.copy()  # the next gradient entry
    for r in range(R):
        slot = np.zeros(count, dtype=np.int64)
        for j in range(positions.shape[1]):
            if positions[r, j] >= total:
                break
            i, k = _row_and_sample(positions[r, j], n)
            kind = k if count == 2 else 1  # one sample: the gradient rows
            code = ((r * 2 + kind) << width) | slot[k]
            if kind == 0:
                entries[fill[i]] = code
                fill[i] += 1
            else:
                entries[fill_gradient[i]] = code
                fill_gradient[i] += 1
            slot[k] += 1
    return order, starts, mids, entries, lengths, width


@njit(cache=True)
def _standardized_entries(P, U, order, starts, entries, width, d, K, m, mean, std, XS, norms):
    """Every entry's first m columns as its run standardises them, ``XS[t]`` (m,):
    :func:`raco_cli.privacy.preprocessing.standardize_columns` (``(u - mean) / std`` of the
    row's ``u = U[i]`` in float64, rounded to float32), zeros for a neutralised row (infinite
    norm), as ``GroupRows.gather`` writes them; and its norm ``norms[t]``,
    ``sqrt(|rest|^2 + |XS[t]|^2 + 1)`` (the packed norm column holds ``|rest|^2`` when m > 0),
    the neutralised row's infinite norm as it is.  Compiled without fastmath: the same float
    operations as numpy's, so the same bits."""
    for i in order:
        finite = np.isfinite(P[i, d + K])
        for t in range(starts[i], starts[i + 1]):
            if not finite:
                for j in range(m):
                    XS[t, j] = np.float32(0.0)
                norms[t] = P[i, d + K]
                continue
            r = entries[t] >> (width + 1)
            for j in range(m):  # (no reduction in this loop: LLVM may vectorise its divisions)
                XS[t, j] = np.float32((U[i, j] - mean[r, j]) / std[r, j])
            sq = np.float32(0.0)
            for j in range(m):
                sq += XS[t, j] * XS[t, j]
            norms[t] = np.sqrt(P[i, d + K] + sq + np.float32(1.0))


@njit(cache=True, fastmath=_FASTMATH)
def _logits(P, order, starts, entries, width, W, b, d, K, m, XS, Z):
    """Pass 1: ``Z[:, t]``, entry t's logits under its run's (W, b), reading each row once
    (its first m columns as the entry's run standardised them, ``XS[t]``
    (:func:`_standardized_entries`), when m > 0)."""
    for i in order:
        x = P[i, m:d]  # the columns read as they are: slices and a loop from 0, which LLVM
        # vectorises (a loop over range(m, d) it did not: the pass took 6x as long)
        for t in range(starts[i], starts[i + 1]):
            r = entries[t] >> (width + 1)
            xs = XS[t]
            for k in range(K):
                acc = b[r, k]
                for j in range(m):
                    acc += W[r, k, j] * xs[j]
                w = W[r, k, m:d]
                for j in range(d - m):
                    acc += w[j] * x[j]
                Z[k, t] = acc


@njit(cache=True)
def _histograms(cell, order, starts, mids, entries, width, pt, K, H, shared):
    """Each histogram row's tempered softmax ``pt[:, t]`` added to its run's histogram at the
    row's cell (paper eq. 8); a non-finite rate counts 0 (core._histogram).  ``shared``: the
    gradient rows are the histogram's."""
    for i in order:
        q = cell[i]
        if q < 0:
            continue
        lo, hi = (mids[i], starts[i + 1]) if shared else (starts[i], mids[i])
        for t in range(lo, hi):
            r = entries[t] >> (width + 1)
            for k in range(K):
                v = pt[k, t]
                if np.isfinite(v):
                    H[r, q, k] += v


@njit(cache=True, fastmath=_FASTMATH)
def _clipped_sums(P, cell, order, mids, starts, entries, width, p, pt, weights, regularized, reg_temp, clip, clipping, d, K, m, XS, norms,
                  GW, Gb, clipped, norm_sum, nonfinite):
    """Pass 2: each gradient row's logit gradient ``p - e_y`` plus the regularizer's term
    (eq. 10) from the entries' softmax ``p`` and tempered softmax ``pt``, its norm, clip
    factor and contribution to its run's sums (the row's first m columns and norm as the
    entry's run standardised them, ``XS[t]`` and ``norms[t]``, when m > 0)."""
    g = np.empty(K, dtype=np.float32)
    for i in order:
        q = cell[i]
        for t in range(mids[i], starts[i + 1]):  # the gradient entries
            r = entries[t] >> (width + 1)
            for k in range(K):
                g[k] = p[k, t] - P[i, d + k]  # p - e_y
            if regularized and q >= 0:  # the row's cell weights c = weights[r, q] (none: c = 0)
                inner = np.float32(0.0)
                for k in range(K):
                    inner += weights[r, q, k] * pt[k, t]
                for k in range(K):
                    g[k] = g[k] + reg_temp[r] * pt[k, t] * (weights[r, q, k] - inner)
            xs = XS[t]
            xnorm = norms[t] if m else P[i, d + K]
            sq = np.float32(0.0)
            for k in range(K):
                sq += g[k] * g[k]
            norm = np.sqrt(sq) * xnorm
            if clipping and norm > clip[r]:  # (an infinite norm counts as clipped, as in torch)
                clipped[r] += 1
            if not np.isfinite(norm):  # dropped: factor 0
                nonfinite[r] += 1
                continue
            norm_sum[r] += norm
            f = min(np.float32(1.0), clip[r] / (norm + np.float32(1e-12))) if clipping else np.float32(1.0)
            x = P[i, m:d]  # (slices and loops from 0: vectorised, see _logits)
            for k in range(K):
                fg = g[k] * f
                Gb[r, k] += fg
                for j in range(m):
                    GW[r, k, j] += fg * xs[j]
                a = GW[r, k, m:d]
                for j in range(d - m):
                    a[j] += fg * x[j]


@njit(cache=True, fastmath=_FASTMATH)
def _binary_clipped_sums(P, cell, order, mids, starts, entries, width, p, pt, weights, regularized, reg_temp, clip, clipping, d, m, XS,
                         norms, S, Sb, clipped, norm_sum, nonfinite):
    """Pass 2 of a binary task: :func:`_clipped_sums` with K = 2 in scalars (no per-entry class
    loops: 2.8 against 4.1 ms on a captured Adult R = 160 step), class 1's clipped sums alone
    into ``S`` (R, d) and ``Sb`` (R,) (class 0's are their negation, :meth:`Scan.clipped_sums`);
    the norm from both classes, as torch's."""
    for i in order:
        q = cell[i]
        y0, y1, row_norm = P[i, d], P[i, d + 1], P[i, d + 2]  # e_y, then the packed norm column
        x = P[i, m:d]  # (slices and loops from 0: vectorised, see _logits)
        for t in range(mids[i], starts[i + 1]):  # the gradient entries
            r = entries[t] >> (width + 1)
            g0, g1 = p[0, t] - y0, p[1, t] - y1  # p - e_y
            if regularized and q >= 0:  # the row's cell weights c = weights[r, q] (none: c = 0)
                c0, c1, a0, a1 = weights[r, q, 0], weights[r, q, 1], pt[0, t], pt[1, t]
                inner = c0 * a0 + c1 * a1
                g0 = g0 + reg_temp[r] * a0 * (c0 - inner)
                g1 = g1 + reg_temp[r] * a1 * (c1 - inner)
            norm = np.sqrt(g0 * g0 + g1 * g1) * (norms[t] if m else row_norm)
            if clipping and norm > clip[r]:  # (an infinite norm counts as clipped, as in torch)
                clipped[r] += 1
            if not np.isfinite(norm):  # dropped: nothing added
                nonfinite[r] += 1
                continue
            norm_sum[r] += norm
            f1 = g1 * (min(np.float32(1.0), clip[r] / (norm + np.float32(1e-12))) if clipping else np.float32(1.0))
            Sb[r] += f1
            xs = XS[t]
            for j in range(m):
                S[r, j] += f1 * xs[j]
            a = S[r, m:d]
            for j in range(d - m):
                a[j] += f1 * x[j]


@njit(cache=True, fastmath=_FASTMATH)
def _w_sums(cell, order, mids, starts, entries, width, p, dist, clip_w, by_group, row_sum, clipped):
    """DP-FERMI's W-player terms of each gradient row: ``F = p[:, t]`` (rows with a non-finite
    F add nothing), its norm ``2 sqrt(sum_l F_l^2 dist[r, g, l])``, clip factor
    ``min(1, C_w / norm)``, and the clipped F added to its group's sum and to the run's total."""
    K = p.shape[0]
    for i in order:
        q = cell[i]
        for t in range(mids[i], starts[i + 1]):  # the gradient entries, the W player's rows
            r = entries[t] >> (width + 1)
            finite = True
            for k in range(K):
                if not np.isfinite(p[k, t]):
                    finite = False
            if not finite:
                continue
            sq = np.float32(0.0)
            if q >= 0:  # (a row without a group: distance 0, its F in the total only, as torch's product)
                for k in range(K):
                    sq += p[k, t] * p[k, t] * dist[r, q, k]
            norm = np.float32(2.0) * np.sqrt(max(sq, np.float32(0.0)))
            if norm > clip_w[r]:
                clipped[r] += 1
            f = min(np.float32(1.0), clip_w[r] / (norm + np.float32(1e-12)))
            for k in range(K):
                if q >= 0:
                    by_group[r, q, k] += f * p[k, t]
                row_sum[r, k] += f * p[k, t]
