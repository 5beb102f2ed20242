"""The data pass of an SGDA step on the CPU, compiled: every sampled row read once, in row order.

Every linear run on the CPU trains through this pass, alone (a group of one) or in a sweep
group (:func:`raco_cli.methods.sgda.batched.run_core`, :func:`raco_cli.methods.dp_fermi.fit_many`),
so a run computes the same numbers whether it was grouped or not (docs/batched.md, "One path").
A step of R runs reads R x (2 x ~B) Poisson rows; gathered run by run each read is a random
access to the packed table, so here the step's samples are inverted (for each row, which runs
sampled it, as histogram or gradient row: :func:`_invert`) and each sampled row is read once per
pass:

1. :meth:`Scan.logits`: every entry's row as its run reads it (its first m columns standardised
   by the run's DP scaling, scope=model), its norm and its logits (the dot products), an entry
   being one (run, sample, row) of the step; for two classes the margin alone
   (:func:`margin_weights`);
2. between the passes, vectorised in numpy: every entry's softmax and tempered softmax
   (numpy's SIMD exp), and (constrained runs, :meth:`Scan.histograms`) each histogram row's
   tempered softmax, or its arg-max one-hot under ``dual=hard``, added to its cell (paper eq. 8);
3. :meth:`Scan.clipped_sums`: each gradient row's logit gradient with the regularizer (eq. 10),
   its norm, clip factor and contribution to its run's sums; for DP-FERMI also its W player's
   clipped sums (:meth:`Scan.w_clipped_sums`).

Before the passes, :meth:`Scan.positions` draws the step's Poisson samples as
:func:`raco_cli.privacy.mechanisms.poisson_positions_many` does, its gaps summed by the compiled
:func:`gap_sums`.  After them the dual step of every run (:func:`dual_step`), and at every
evaluation each run's logits on each split (:func:`eval_logits`).

Why a run's numbers cannot depend on its group (neither on R, nor on the other runs, nor on
where its arrays lie in memory), on any CPU: every per-run number is either an elementwise IEEE
operation, or a sum whose terms are added in an order fixed by the run's own data.  A run's
sums (histogram, clipped gradient sums, norm sums) add its rows in increasing row order, one
after another.  An entry's dot products and squared norm are the one place where the compiler
may reorder additions (``fastmath`` with ``reassoc`` and ``contract`` in :func:`_entries`: the
vectorised reductions): each is one loop at one place in the code over the entry's own row of
d floats, so its order depends on d and on the compiled instruction set only, and every entry of
every run, alone or grouped, runs that loop.  A row standardised before training (a run alone,
``dataset.preprocessing=dp``) and the same row standardised here for its run (a group) are the
same float32 row (:func:`raco_cli.privacy.preprocessing.standardize_columns`, bit for bit), and
both go through the same loop.  The other kernels have no fastmath.  What the instruction set
changes (AVX2 against AVX-512: the vectorised reductions' order, numpy's SIMD exp and log) moves
a seeded run's last bits from one machine to another, never a run against itself grouped.
``tests/unit/methods/test_batched.py`` checks it bit for bit, ``tests/e2e/test_instruction_sets.py``
under other instruction sets (``make test-widths``).

NaN and inf keep their IEEE meaning (no ``nnan`` / ``ninf``), so non-finite rows are found and
dropped.  The softmax is torch's max-shifted form, so a non-finite logit gives NaN rates
(counted 0 in a histogram) as in torch.

numba compiles the kernels on first use (a few seconds, then cached in ``__pycache__``); this
module, and numba with it, is imported only when a linear run trains on the CPU
(:func:`raco_cli.methods.sgda.batched.run_core`, :func:`raco_cli.methods.dp_fermi.fit_many`):
``raco --help`` never imports it.  Groups on an accelerator keep torch's path
(:func:`raco_cli.methods.batched.compiled_scan_applies`).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from raco_cli.methods.group_rows import GroupRows, GroupSum
from raco_cli.privacy.mechanisms import SecureUniforms, poisson_positions_many
from raco_cli.privacy.preprocessing import unit_columns

_FASTMATH = {"reassoc", "contract"}  # pass 1's vectorised dot products and norms only; no nnan / ninf
#: the sparse inversion (a sort of the step's entries) below this many entries per training row;
#: the counting sort over the n rows above (a run alone: ~2B of n rows; a sweep group: R x 2B)
SPARSE_BELOW = 0.125


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
        # a row with a non-finite feature is neutralised (GroupRows: zero features, infinite
        # norm column): its entries' norms are infinite and its logits the biases
        self.finite = np.isfinite(self.P[:, self.d + self.K])
        self.starts = self.mids = self.entries = np.empty(0, dtype=np.int64)
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
        # and each entry's standardised columns and norm, written by pass 1 and read by pass 2
        self.U = unit_columns(self.P[:, : self.m])
        # what the passes read: (packed rows, their u, cells, finiteness, the sampled rows' indices
        # in them, increasing); :meth:`sample` sets them
        self.rows = (self.P, self.U, self.cell, self.finite, np.empty(0, dtype=np.int64))
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
        expected = float(np.count_nonzero(positions < count * self.n))
        sparse = expected < SPARSE_BELOW * self.n
        order, self.starts, self.mids, self.entries, lengths, self.width = _invert(positions, self.n, count, sparse)
        if sparse:  # the few sampled rows copied together first (np.take overlaps the reads of far-apart rows,
            # which the passes, working on each row as they read it, did not: a run alone's pass 1 took 2-4x as long)
            self.rows = (np.take(self.P, order, axis=0), self.U[order], self.cell[order], self.finite[order], np.arange(len(order)))
        else:
            self.rows = (self.P, self.U, self.cell, self.finite, order)
        if self.Z.shape[1] < len(self.entries):
            size = len(self.entries) + len(self.entries) // 8
            self.Z = np.zeros((self.K, size), dtype=np.float32)  # (a binary task's row 0 stays 0: margin_logits)
            self.XS, self.norms = np.empty((size, self.m), dtype=np.float32), np.empty(size, dtype=np.float32)
        self.pt = self.p = None
        return lengths

    def logits(self, W: torch.Tensor, b: torch.Tensor) -> None:
        """Pass 1: every entry's row as its run reads it, its norm and its logits."""
        Wn, bn = W.numpy(), b.numpy()
        if self.K == 2:  # binary: the margin alone (the softmax is shift-invariant), half the products
            Wn, bn = margin_weights(Wn, bn)
        P, U, _, finite, order = self.rows
        _entries(P, U, finite, order, self.starts, self.entries, self.width, Wn, bn, self.d, self.m, self.mean,
                 self.std, self.XS, self.norms, self.Z[1:] if self.K == 2 else self.Z)

    def histograms(self, W: torch.Tensor, b: torch.Tensor, temperature: np.ndarray, *, hard: bool = False) -> torch.Tensor:
        """Exact histograms (R, Q, K) float64 of the histogram rows under each run's tempered
        softmax (``temperature`` (R,)), or of their arg-max one-hots (``hard``: ``dual=hard``);
        keeps every entry's tempered softmax for the regularizer of :meth:`clipped_sums`."""
        self.logits(W, b)
        self.pt = self._softmax(temperature)
        H = np.zeros((self.R, self.Q, self.K))
        _, _, cell, _, order = self.rows
        _histograms(cell, order, self.starts, self.mids, self.entries, self.width, self._onehots() if hard else self.pt, self.K, H,
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
        max-shifted form: a non-finite logit gives NaN rates, as in torch.  Elementwise, and
        reduced over the class axis only: an entry's rates are its own logits' whatever the
        other entries."""
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
        P, _, cell, _, order = self.rows
        if K == 2:
            # a binary row's logit gradient is (-a, a): p and pt sum to 1 and e_y is one-hot, so
            # p - e_y = (-(p_1 - y_1), p_1 - y_1) and the regularizer's pt * (c - <c, pt>) =
            # pt_0 pt_1 (c_0 - c_1, c_1 - c_0) (eq. 10); its clipped outer products sum to
            # (-S, S), and the kernel adds class 1's S alone (half the products)
            S, Sb = np.zeros((R, d), dtype=np.float32), np.zeros(R, dtype=np.float32)
            _binary_clipped_sums(P, cell, order, self.mids, self.starts, self.entries, self.width, p, pt, weights32,
                                 weights is not None, reg_temp.astype(np.float32), clip32, clip is not None, self.d, self.m, self.XS,
                                 self.norms, S, Sb, clipped, norm_sum, nonfinite)
            GW[:, 1], Gb[:, 1] = S, Sb
            np.negative(S, out=GW[:, 0])
            np.negative(Sb, out=Gb[:, 0])
        else:
            _clipped_sums(P, cell, order, self.mids, self.starts, self.entries, self.width, p, pt, weights32,
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
        _, _, cell, _, order = self.rows
        _w_sums(cell, order, self.mids, self.starts, self.entries, self.width, self.p, dist.numpy(), clip_w.astype(np.float32),
                by_group, total, clipped)
        return torch.from_numpy(by_group), torch.from_numpy(total), torch.from_numpy(clipped)


def margin_weights(W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A binary task's margin weights, ``W[:, 1] - W[:, 0]`` (R, 1, d) and ``b[:, 1] - b[:, 0]``
    (R, 1): :func:`_entries` under them writes ``z_1 - z_0`` into the logits' row 1 over a row 0
    of zeros, the logits shifted by ``-z_0``, one dot product instead of two.  The softmax,
    tempered or not, is shift-invariant and the arg-max keeps its first maximal class, so the
    rates are the logits' (to float32 rounding); a non-finite margin gives NaN rates, as
    non-finite logits do, and a NaN margin's arg-max is class 1, torch's when class 1's logit
    is NaN (when both are, torch's is class 0: a one-hot either way)."""
    return np.ascontiguousarray((W[:, 1] - W[:, 0])[:, None, :]), np.ascontiguousarray((b[:, 1] - b[:, 0])[:, None])


def eval_logits(X: np.ndarray, U: np.ndarray, mean: np.ndarray, std: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Every run's logits (R, Kw, n) float32 on the rows of a split, ``b_r + W_r x`` (``W``
    (R, Kw, d) float32, ``b`` (R, Kw); binary tasks pass :func:`margin_weights`, Kw = 1).

    ``X`` (d, n) float32: the split's rows transposed, as the runs read them, except the first
    m = ``mean.shape[1]`` columns when the runs standardise them each their own way (``U`` (m, n)
    float64: their ``u`` of :func:`raco_cli.privacy.preprocessing.unit_columns`; ``mean``,
    ``std`` (R, m)): run r then reads ``float32((u - mean_r) / std_r)``, the row
    :func:`raco_cli.privacy.preprocessing.standardize_columns` writes.  Each logit adds its d
    products in column order, one after another (the vectorised loop runs over rows): a run's
    logits are the same alone or in a group, and on any instruction set."""
    R, Kw, _ = W.shape
    out = np.empty((R, Kw, X.shape[1]), dtype=np.float32)
    _eval_logits(X, U, mean, std, np.ascontiguousarray(W, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32), out)
    return out


# --- the kernels ------------------------------------------------------------------------------
# An entry codes (run r, kind s, slot) as ((2 r + s) << width) | slot: s = 0 a histogram row,
# s = 1 a gradient row, at that slot of run r's sample.  The passes visit the sampled rows
# ``order[u]`` in increasing order; row order[u]'s histogram entries are
# ``entries[starts[u]:mids[u]]`` and its gradient entries ``entries[mids[u]:starts[u + 1]]``,
# runs in increasing order in each.


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
def _invert(positions, n, count, sparse):
    """Every (run, kind, slot) sorted by its row, read from the runs' sampled positions (R, W)
    over ``count * n`` virtual rows (the k-th sample of run r at ``k * n + i``, increasing, then
    past the end): ``order`` (U,) the sampled rows in increasing order, ``starts`` (U + 1,),
    ``mids`` (U,) and ``entries`` (see the note above the kernels; a pass reads only its own
    kind: no branch on the kind, which the CPU mispredicted on every other entry); the sample
    sizes (R, count) and the bits of a slot.

    ``sparse``: a stable sort of the entries by (row, kind) (a run alone: ~2B entries over n
    rows); else a counting sort over the n rows (a group whose samples cover the rows).  Both
    give the same arrays."""
    R, total = positions.shape[0], count * n
    lengths = np.zeros((R, count), dtype=np.int64)
    E = 0
    for r in range(R):
        for j in range(positions.shape[1]):
            if positions[r, j] >= total:  # increasing: the rest is past the end too
                break
            i, k = _row_and_sample(positions[r, j], n)
            lengths[r, k] += 1
            E += 1
    longest, width = max(lengths.max(), 1), 0
    while longest > 0:
        width += 1
        longest >>= 1
    entries = np.empty(E, dtype=np.int64)
    if sparse:
        keys = np.empty(E, dtype=np.int64)  # 2 i + kind
        codes = np.empty(E, dtype=np.int64)
        e = 0
        for r in range(R):
            slot = np.zeros(count, dtype=np.int64)
            for j in range(positions.shape[1]):
                if positions[r, j] >= total:
                    break
                i, k = _row_and_sample(positions[r, j], n)
                kind = k if count == 2 else 1  # one sample: the gradient rows
                keys[e] = 2 * i + kind
                codes[e] = ((r * 2 + kind) << width) | slot[k]
                slot[k] += 1
                e += 1
        perm = np.argsort(keys, kind="mergesort")  # stable: runs stay in increasing order
        U = 0
        for e in range(E):
            if e == 0 or keys[perm[e]] >> 1 != keys[perm[e - 1]] >> 1:
                U += 1
        order = np.empty(U, dtype=np.int64)
        starts = np.empty(U + 1, dtype=np.int64)
        mids = np.empty(U, dtype=np.int64)
        u = -1
        for e in range(E):
            key = keys[perm[e]]
            if e == 0 or key >> 1 != keys[perm[e - 1]] >> 1:
                u += 1
                order[u], starts[u], mids[u] = key >> 1, e, e
            if key & 1 == 0:  # a histogram entry: the gradient entries start after it
                mids[u] = e + 1
            entries[e] = codes[perm[e]]
        starts[U] = E
        return order, starts, mids, entries, lengths, width
    row_starts = np.zeros(n + 1, dtype=np.int64)
    hist = np.zeros(n, dtype=np.int64)  # each row's histogram entries
    for r in range(R):
        for j in range(positions.shape[1]):
            if positions[r, j] >= total:
                break
            i, k = _row_and_sample(positions[r, j], n)
            row_starts[i + 1] += 1
            if count == 2 and k == 0:
                hist[i] += 1
    for i in range(1, n + 1):
        row_starts[i] += row_starts[i - 1]
    U = 0
    for i in range(n):
        if row_starts[i + 1] > row_starts[i]:
            U += 1
    order = np.empty(U, dtype=np.int64)  # the rows some run sampled, increasing
    starts = np.empty(U + 1, dtype=np.int64)
    mids = np.empty(U, dtype=np.int64)
    u = 0
    for i in range(n):
        if row_starts[i + 1] > row_starts[i]:
            order[u], starts[u], mids[u] = i, row_starts[i], row_starts[i] + hist[i]
            u += 1
    starts[U] = E
    fill = row_starts[:n].copy()  # the next histogram entry of each row
    fill_gradient = row_starts[:n] + hist  # the next gradient entry
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


@njit(cache=True, fastmath=_FASTMATH)
def _entries(P, U, finite, order, starts, entries, width, W, b, d, m, mean, std, XS, norms, Z):
    """Pass 1, every entry t of the step: its row v (d,) as its run r reads it, its norm
    ``norms[t] = sqrt(|v|^2 + 1)`` (infinite for a neutralised row) and its logits
    ``Z[k, t] = b[r, k] + <W[r, k], v>``.

    v is the packed row; with per-run standardisation (m > 0) its first m columns are
    ``float32((u - mean_r) / std_r)`` in float64 (bit for bit
    :func:`raco_cli.privacy.preprocessing.standardize_columns`; zeros for a neutralised row, as
    ``GroupRows.gather`` writes them), kept in ``XS[t]`` for pass 2.  The norm and the dot
    products are computed at one place each from v, for every entry (module docstring): a row
    standardised before training and the same row standardised here give the same bits."""
    v = np.empty(d, dtype=np.float32)
    Kw = W.shape[1]
    for u in range(len(order)):
        i = order[u]
        ok = finite[i]
        rest, v_rest = P[i, m:d], v[m:]  # the columns every run reads as they are (slices and a
        for j in range(d - m):  # loop from 0, which LLVM vectorises: over range(m, d) it did not, 3x the time)
            v_rest[j] = rest[j]
        sq = np.float32(0.0)
        for t in range(starts[u], starts[u + 1]):
            r = entries[t] >> (width + 1)
            if m > 0:
                for j in range(m):  # (no reduction in this loop: LLVM may vectorise its divisions)
                    v[j] = np.float32((U[i, j] - mean[r, j]) / std[r, j]) if ok else np.float32(0.0)
                    XS[t, j] = v[j]
            if m > 0 or t == starts[u]:  # the row's norm: once per entry with per-run columns, else once per row
                sq = np.float32(0.0)
                for j in range(d):
                    sq += v[j] * v[j]
            norms[t] = np.sqrt(sq + np.float32(1.0)) if ok else np.float32(np.inf)
            for k in range(Kw):
                acc = b[r, k]
                w = W[r, k]
                for j in range(d):
                    acc += w[j] * v[j]
                Z[k, t] = acc


@njit(cache=True)
def _histograms(cell, order, starts, mids, entries, width, pt, K, H, shared):
    """Each histogram row's tempered softmax ``pt[:, t]`` added to its run's histogram at the
    row's cell (paper eq. 8), rows in increasing order; a non-finite rate counts 0
    (core._histogram).  ``shared``: the gradient rows are the histogram's."""
    for u in range(len(order)):
        q = cell[order[u]]
        if q < 0:
            continue
        lo, hi = (mids[u], starts[u + 1]) if shared else (starts[u], mids[u])
        for t in range(lo, hi):
            r = entries[t] >> (width + 1)
            for k in range(K):
                v = pt[k, t]
                if np.isfinite(v):
                    H[r, q, k] += v


@njit(cache=True)
def _clipped_sums(P, cell, order, mids, starts, entries, width, p, pt, weights, regularized, reg_temp, clip, clipping, d, K, m, XS, norms,
                  GW, Gb, clipped, norm_sum, nonfinite):
    """Pass 2: each gradient row's logit gradient ``p - e_y`` plus the regularizer's term
    (eq. 10) from the entries' softmax ``p`` and tempered softmax ``pt``, its norm (from pass
    1's ``norms[t]``), clip factor and contribution to its run's sums, rows in increasing
    order (the row's first m columns as the entry's run standardised them, ``XS[t]``, when
    m > 0)."""
    g = np.empty(K, dtype=np.float32)
    for u in range(len(order)):
        i = order[u]
        q = cell[i]
        x = P[i, m:d]
        for t in range(mids[u], starts[u + 1]):  # the gradient entries
            r = entries[t] >> (width + 1)
            for k in range(K):
                g[k] = p[k, t] - P[i, d + k]  # p - e_y
            if regularized and q >= 0:  # the row's cell weights c = weights[r, q] (none: c = 0)
                inner = np.float32(0.0)
                for k in range(K):
                    inner += weights[r, q, k] * pt[k, t]
                for k in range(K):
                    g[k] = g[k] + reg_temp[r] * pt[k, t] * (weights[r, q, k] - inner)
            sq = np.float32(0.0)
            for k in range(K):
                sq += g[k] * g[k]
            norm = np.sqrt(sq) * norms[t]
            if clipping and norm > clip[r]:  # (an infinite norm counts as clipped, as in torch)
                clipped[r] += 1
            if not np.isfinite(norm):  # dropped: factor 0
                nonfinite[r] += 1
                continue
            norm_sum[r] += norm
            f = min(np.float32(1.0), clip[r] / (norm + np.float32(1e-12))) if clipping else np.float32(1.0)
            xs = XS[t]
            for k in range(K):
                fg = g[k] * f
                Gb[r, k] += fg
                for j in range(m):
                    GW[r, k, j] += fg * xs[j]
                a = GW[r, k, m:d]
                for j in range(d - m):
                    a[j] += fg * x[j]


@njit(cache=True)
def _binary_clipped_sums(P, cell, order, mids, starts, entries, width, p, pt, weights, regularized, reg_temp, clip, clipping, d, m, XS,
                         norms, S, Sb, clipped, norm_sum, nonfinite):
    """Pass 2 of a binary task: :func:`_clipped_sums` with K = 2 in scalars (no per-entry class
    loops: 2.8 against 4.1 ms on a captured Adult R = 160 step), class 1's clipped sums alone
    into ``S`` (R, d) and ``Sb`` (R,) (class 0's are their negation, :meth:`Scan.clipped_sums`);
    the norm from both classes, as torch's."""
    for u in range(len(order)):
        i = order[u]
        q = cell[i]
        y0, y1 = P[i, d], P[i, d + 1]  # e_y
        x = P[i, m:d]  # (slices and loops from 0: vectorised; a loop over range(m, d) was not)
        for t in range(mids[u], starts[u + 1]):  # the gradient entries
            r = entries[t] >> (width + 1)
            g0, g1 = p[0, t] - y0, p[1, t] - y1  # p - e_y
            if regularized and q >= 0:  # the row's cell weights c = weights[r, q] (none: c = 0)
                c0, c1, a0, a1 = weights[r, q, 0], weights[r, q, 1], pt[0, t], pt[1, t]
                inner = c0 * a0 + c1 * a1
                g0 = g0 + reg_temp[r] * a0 * (c0 - inner)
                g1 = g1 + reg_temp[r] * a1 * (c1 - inner)
            norm = np.sqrt(g0 * g0 + g1 * g1) * norms[t]
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


@njit(cache=True)
def _w_sums(cell, order, mids, starts, entries, width, p, dist, clip_w, by_group, row_sum, clipped):
    """DP-FERMI's W-player terms of each gradient row: ``F = p[:, t]`` (rows with a non-finite
    F add nothing), its norm ``2 sqrt(sum_l F_l^2 dist[r, g, l])``, clip factor
    ``min(1, C_w / norm)``, and the clipped F added to its group's sum and to the run's total."""
    K = p.shape[0]
    for u in range(len(order)):
        q = cell[order[u]]
        for t in range(mids[u], starts[u + 1]):  # the gradient entries, the W player's rows
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


@njit(cache=True)
def dual_step(membership, alpha, H, lam, floors, gamma):
    """:meth:`raco_cli.constraints.rate.ConstraintTensors.step` of R runs (paper eq. 12 and the
    regularizer's weights of eq. 10), each run's sums in a fixed order: regularizer weights
    (R, Q, K) and dual gradients ``Gamma_post(H_r) - gamma_r`` (R, J) of the noisy histograms
    ``H`` (R, Q, K), denominators read from them (subset membership (M, Q), ``alpha`` (J, M, K))
    and clamped to each run's floor ``floors`` (R,); ``lam`` (R, J), ``gamma`` (R, J)."""
    R, Q, K = H.shape
    J, M = alpha.shape[0], alpha.shape[1]
    weights = np.zeros((R, Q, K))
    g = np.empty((R, J))
    denom = np.empty(M)
    rates = np.empty((M, K))
    for r in range(R):
        for s in range(M):  # each subset's noisy size (clamp_denominators) and rates (constraints.rate.rates)
            size = 0.0
            for q in range(Q):
                if membership[s, q] != 0.0:
                    row = 0.0
                    for k in range(K):
                        row += H[r, q, k]
                    size += membership[s, q] * row
            denom[s] = max(size, floors[r])
            for k in range(K):
                mass = 0.0
                for q in range(Q):
                    if membership[s, q] != 0.0:
                        mass += membership[s, q] * H[r, q, k]
                rates[s, k] = min(max(mass / denom[s], 0.0), 1.0)
        for j in range(J):
            total = 0.0
            for s in range(M):
                for k in range(K):
                    total += rates[s, k] * alpha[j, s, k]
            g[r, j] = total - gamma[r, j]
        for s in range(M):
            for k in range(K):
                per_subset = 0.0
                for j in range(J):
                    per_subset += lam[r, j] * alpha[j, s, k]
                c = per_subset / denom[s]
                for q in range(Q):
                    if membership[s, q] != 0.0:
                        weights[r, q, k] += membership[s, q] * c
    return weights, g


EVAL_BLOCK = 256  # rows of an evaluation block: its logits stay in L1 while the d columns stream by


@njit(cache=True)
def _eval_logits(X, U, mean, std, W, b, out):
    """:func:`eval_logits`: blocks of rows, each logit ``b + sum_j W[j] x[j]`` over j in
    column order (mul, then add: no fastmath), vectorised over the block's rows."""
    d, n = X.shape
    R, Kw = W.shape[0], W.shape[1]
    m = mean.shape[1]
    V = np.empty((m, EVAL_BLOCK), dtype=np.float32)  # the block's standardised columns, per run
    for i0 in range(0, n, EVAL_BLOCK):
        i1 = min(n, i0 + EVAL_BLOCK)
        L = i1 - i0
        for r in range(R):
            for j in range(m):
                u = U[j, i0:i1]
                vj = V[j]
                for e in range(L):
                    vj[e] = np.float32((u[e] - mean[r, j]) / std[r, j])
            for k in range(Kw):
                acc = out[r, k, i0:i1]
                bk = b[r, k]
                for e in range(L):
                    acc[e] = bk
                for j in range(m):  # the standardised columns, then the others: column order either way
                    w, x = W[r, k, j], V[j]
                    for e in range(L):
                        acc[e] = acc[e] + w * x[e]
                for j in range(m, d):
                    w, x = W[r, k, j], X[j, i0:i1]
                    for e in range(L):
                        acc[e] = acc[e] + w * x[e]
