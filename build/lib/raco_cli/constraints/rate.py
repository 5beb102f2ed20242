"""Generalized rate constraints as data (paper Section 3, eq. 6; Appendix A).

A rate constraint j is ``Gamma_j(theta) = sum_{I in I_j} sum_k alpha_{j,I,k} P_k(D_I; theta) <= gamma_j``
where ``D_I`` is a union of cells of a *global partition* ``{D_1..D_Q}`` and ``P_k`` is the
(soft or hard) rate of predicted class k on it.

Constraints are written over the *fine cells* ``(label y, group z)`` of a dataset; the global
partition is then derived as the smallest one that serves every constraint (paper Remark 1):
two fine cells share a global cell iff every subset used by any constraint contains both or
neither.  One :class:`ConstraintSet` serves

* the private histogram ``H`` (Q, K) of the step (paper eq. 8): :meth:`cells` maps rows to q,
* ``Gamma_post(H)`` for the dual step (paper eq. 12): :meth:`gamma_post`,
* the per-sample regularizer weights of the primal step (paper eq. 10): :meth:`cell_weights`,
* the exact (non-private) constraint values of the evaluation: :meth:`gamma_post` on an
  exact histogram of a whole split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raco_cli.errors import GAMMA_RANGE, ConfigError

FineCell = tuple[int, int]  # (label y, group z)


@dataclass(frozen=True)
class RateTerm:
    """One term ``alpha * P_k(D_S)`` of a rate constraint.

    Attributes:
        subset: the fine cells ``(y, z)`` whose union is ``D_S``.
        k: predicted class whose rate is taken.
        alpha: public weight.
    """

    subset: frozenset[FineCell]
    k: int
    alpha: float


@dataclass(frozen=True)
class RateConstraint:
    """One constraint ``Gamma_j = sum_terms alpha * P_k(D_S) <= gamma`` (paper eq. 6).

    ``gamma`` is an allowed gap (>= 0) for the built-in families; a ``custom`` constraint's
    gamma is any right-hand side (``-P_1(S) <= -0.8`` bounds a rate from below).
    """

    name: str
    terms: tuple[RateTerm, ...]
    gamma: float
    family: str = "custom"

    def __post_init__(self) -> None:
        if not np.isfinite(self.gamma) or (self.gamma < 0 and self.family != "custom"):
            raise ConfigError(GAMMA_RANGE.format(value=self.gamma))
        if not self.terms:
            raise ConfigError(f"Rate constraint '{self.name}' has no terms.")
        for t in self.terms:
            if not t.subset:
                raise ConfigError(f"Rate constraint '{self.name}' has a term with an empty subset.")


@dataclass(frozen=True)
class ConstraintSet:
    """A set of J rate constraints compiled to arrays over the smallest global partition.

    Attributes:
        constraints: the J constraints.
        n_classes: K, the number of classes (predicted and true).
        n_groups: number of sensitive groups.
        cell_of: (K, n_groups) int array, fine cell (y, z) -> global cell q in 0..Q-1.
        membership: (M, Q) float array, ``A[m, q] = 1`` iff global cell q is in subset m.
        alpha: (J, M, K) float array of weights.
        gamma: (J,) slacks.
    """

    constraints: tuple[RateConstraint, ...]
    n_classes: int
    n_groups: int
    cell_of: np.ndarray = field(repr=False)
    membership: np.ndarray = field(repr=False)
    alpha: np.ndarray = field(repr=False)
    gamma: np.ndarray = field(repr=False)

    # --- construction --------------------------------------------------------------------

    @classmethod
    def build(
        cls, constraints: Iterable[RateConstraint], *, n_classes: int, n_groups: int
    ) -> ConstraintSet:
        """Compile constraints, deriving the smallest global partition (paper Remark 1)."""
        constraints = tuple(constraints)
        for c in constraints:
            for t in c.terms:
                for y, z in t.subset:
                    if not (0 <= y < n_classes and 0 <= z < n_groups):
                        raise ConfigError(
                            f"Rate constraint '{c.name}' refers to cell (label={y}, group={z}); "
                            f"the data has labels 0..{n_classes - 1} and groups 0..{n_groups - 1}."
                        )
                if not 0 <= t.k < n_classes:
                    raise ConfigError(
                        f"Rate constraint '{c.name}' refers to predicted class {t.k}; "
                        f"the data has classes 0..{n_classes - 1}."
                    )
        subsets = sorted({t.subset for c in constraints for t in c.terms}, key=_subset_key)
        fine = [(y, z) for y in range(n_classes) for z in range(n_groups)]
        # Remark 1: the signature of a fine cell is which subsets contain it.
        signatures = [tuple(cell in s for s in subsets) for cell in fine]
        order = sorted(set(signatures), key=lambda sig: fine[signatures.index(sig)])
        index = {sig: q for q, sig in enumerate(order)}
        cell_of = np.zeros((n_classes, n_groups), dtype=np.int64)
        for (y, z), sig in zip(fine, signatures):
            cell_of[y, z] = index[sig]
        Q = len(order)
        membership = np.zeros((len(subsets), Q))
        for m, s in enumerate(subsets):
            for y, z in s:
                membership[m, cell_of[y, z]] = 1.0
        alpha = np.zeros((len(constraints), len(subsets), n_classes))
        sub_index = {s: m for m, s in enumerate(subsets)}
        for j, c in enumerate(constraints):
            for t in c.terms:
                alpha[j, sub_index[t.subset], t.k] += t.alpha
        gamma = np.array([c.gamma for c in constraints], dtype=float)
        return cls(constraints, n_classes, n_groups, cell_of, membership, alpha, gamma)

    def with_audit_cells(self, n_cells: int, *, label: int) -> ConstraintSet:
        """Audit only (``raco audit``): add ``n_cells`` canary groups with dedicated cells.

        Canary i is a record of the new group ``n_groups + i`` with label ``label``; its fine
        cell ``(label, n_groups + i)`` becomes the global cell ``Q + i`` of its own, and the
        fine cells of the other labels of all canary groups share one extra cell ``Q + n_cells``
        (they hold no rows).  No subset contains the new cells (their membership columns are
        0), so denominators, ``Gamma_post`` and the regularizer weights of the real cells are
        unchanged: training differs from the audited configuration only by the canaries'
        own loss gradients.  The new cells go through the same histogram and noise code as
        the real ones (rows ``Q..Q+n_cells`` of the same (Q', K) array).

        Why dedicated cells: in a populated cell one canary changes a count of ~10^4 sampled
        rows by one, which is barely distinguishable even without noise; alone in its cell it
        is the whole count (research note ``audit.md``, section 4).  Remark-1 merging would put
        every unused fine cell into one global cell, so :meth:`build` cannot produce this.
        """
        if n_cells < 1:
            raise ValueError("n_cells must be >= 1")
        if not 0 <= label < self.n_classes:
            raise ValueError(f"label must be in 0..{self.n_classes - 1}")
        Q = self.Q
        extra = np.full((self.n_classes, n_cells), Q + n_cells, dtype=np.int64)
        extra[label] = Q + np.arange(n_cells)
        cell_of = np.concatenate([self.cell_of, extra], axis=1)
        membership = np.concatenate([self.membership, np.zeros((self.M, n_cells + 1))], axis=1)
        return ConstraintSet(
            self.constraints, self.n_classes, self.n_groups + n_cells, cell_of, membership, self.alpha, self.gamma
        )

    # --- shapes --------------------------------------------------------------------------

    @property
    def J(self) -> int:
        """Number of constraints."""
        return len(self.constraints)

    @property
    def Q(self) -> int:
        """Number of cells of the global partition."""
        return self.membership.shape[1]

    @property
    def M(self) -> int:
        """Number of distinct subsets ``D_I`` used by the constraints."""
        return self.membership.shape[0]

    @property
    def K(self) -> int:
        return self.n_classes

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.constraints)

    @property
    def is_empty(self) -> bool:
        return self.J == 0

    @property
    def families(self) -> tuple[str, ...]:
        """The constraint families of the run, in order of first appearance."""
        return tuple(dict.fromkeys(c.family for c in self.constraints))

    def family_indices(self, family: str) -> list[int]:
        """Indices j of the constraints of one family."""
        return [j for j, c in enumerate(self.constraints) if c.family == family]

    # --- the maths -----------------------------------------------------------------------

    def cells(self, y: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Global cell q of each row, shape (n,)."""
        return self.cell_of[np.asarray(y), np.asarray(group)]

    def histogram(self, probs: np.ndarray, cells: np.ndarray) -> np.ndarray:
        """Exact histogram ``H[q, k] = sum_{x in D_q} probs[x, k]`` (paper eq. 8), shape (Q, K)."""
        H = np.zeros((self.Q, self.K))
        np.add.at(H, cells, probs)
        return H

    def denominators(self, H: np.ndarray, *, floor: float | None) -> np.ndarray:
        """``|B_I| = sum_{i in I} sum_k H[i, k]`` per subset, shape (M,).

        Read from the (noisy) histogram as post-processing (paper Section 4.2).
        With ``floor`` the values pass through :func:`clamp_denominators`; with ``None``
        zero denominators (empty subsets) give NaN rates downstream.
        """
        return denominators(self.membership, np.asarray(H, dtype=float), floor)

    def rates(self, H: np.ndarray, *, floor: float | None) -> np.ndarray:
        """``P_k(D_I) = sum_{i in I} H[i,k] / |B_I|``, shape (M, K)."""
        return rates(self.membership, np.asarray(H, dtype=float), floor)

    def gamma_post(self, H: np.ndarray, *, floor: float | None) -> np.ndarray:
        """``Gamma_post_j(H)`` (paper eq. 12), shape (J,).

        On the exact histogram of a set of rows this equals ``Gamma_j`` on those rows.
        """
        return gamma_post(self.membership, self.alpha, np.asarray(H, dtype=float), floor)

    def cell_weights(self, H: np.ndarray, lam: np.ndarray, *, floor: float) -> np.ndarray:
        """Per-sample regularizer weights ``c[q, k]`` (paper eq. 10), shape (Q, K); see
        :func:`cell_weights`."""
        return cell_weights(self.membership, self.alpha, np.asarray(H, dtype=float), np.asarray(lam, dtype=float), floor)

    def to_torch(self, device: Any = "cpu") -> ConstraintTensors:
        """The arrays as float64 torch tensors on a device, for the training loop."""
        import torch

        return ConstraintTensors(
            membership=torch.as_tensor(self.membership, dtype=torch.float64, device=device),
            alpha=torch.as_tensor(self.alpha, dtype=torch.float64, device=device),
            gamma=torch.as_tensor(self.gamma, dtype=torch.float64, device=device),
        )


@dataclass(frozen=True)
class ConstraintTensors:
    """:class:`ConstraintSet` arrays as torch tensors (the same maths, on the device)."""

    membership: Any
    alpha: Any
    gamma: Any
    # CPU tensors: the same arrays as numpy views, made once (``Tensor.numpy()`` costs ~2 us a call)
    _host: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.membership.device.type == "cpu":
            object.__setattr__(self, "_host", (self.membership.numpy(), self.alpha.numpy(), self.gamma.numpy()))

    def step(self, H: Any, lam: Any, *, floor: float) -> tuple[Any, Any]:
        """Regularizer weights (Q, K) and dual gradient ``Gamma_post(H) - gamma`` (J,) of a step.

        On the CPU the tiny (Q, K) maths runs in numpy on shared memory and returns numpy
        arrays (a torch op costs several microseconds of dispatch, a numpy op about one; the
        loop keeps the (J,) bookkeeping in numpy too); on an accelerator it stays on the
        device and returns tensors.
        """
        if self._host is not None and H.device.type == "cpu":
            membership, alpha, gamma = self._host
            Hn = H.numpy()
            denom = denominators(membership, Hn, floor)
            return cell_weights(membership, alpha, Hn, lam.numpy(), floor, denom=denom), gamma_post(membership, alpha, Hn, floor, denom=denom) - gamma
        denom = denominators(self.membership, H, floor)
        weights = cell_weights(self.membership, self.alpha, H, lam, floor, denom=denom)
        return weights, gamma_post(self.membership, self.alpha, H, floor, denom=denom) - self.gamma


# --- the maths, written once for numpy arrays and torch tensors -----------------------------
# (``@``, ``.sum(1)``, ``.clip(min=)`` and einsum behave alike in both libraries)


def denominators(membership: Any, H: Any, floor: float | None) -> Any:
    """``|B_I| = sum_{i in I} sum_k H[i, k]`` for every subset I, shape (M,)."""
    denom = membership @ H.sum(1)
    return denom if floor is None else clamp_denominators(denom, floor)


def rates(membership: Any, H: Any, floor: float | None, *, denom: Any = None) -> Any:
    """``P_k(D_I) = sum_{i in I} H[i, k] / |B_I|``, shape (M, K).

    With ``floor=None`` (exact evaluation) an empty subset gives NaN rates.  From a noisy
    histogram (``floor`` set) a rate is clipped to [0, 1], the range every rate has: Laplace
    noise makes a subset's class counts negative or larger than their noisy total, and the raw
    ratio (e.g. 40 / (40 - 35) = 8) would throw the dual variables to their bound in one step
    on small batches.  Clipping is post-processing of the released histogram.
    """
    if denom is None:
        denom = denominators(membership, H, floor)
    if floor is None:  # numpy only: evaluation of exact histograms
        with np.errstate(invalid="ignore", divide="ignore"):
            return (membership @ H) / np.where(denom == 0, np.nan, denom)[:, None]
    r = (membership @ H) / denom[:, None]
    if isinstance(r, np.ndarray):  # clip's values (NaN stays NaN) without its ~3 us of Python per call
        return np.minimum(np.maximum(r, 0.0), 1.0)
    return r.clip(0.0, 1.0)


def gamma_post(membership: Any, alpha: Any, H: Any, floor: float | None, *, denom: Any = None) -> Any:
    """``Gamma_post_j(H) = sum_I sum_k alpha_{j,I,k} sum_{i in I} H[i,k] / sum_{i in I} sum_k H[i,k]``
    (paper eq. 12), shape (J,)."""
    J, M, K = alpha.shape
    return alpha.reshape(J, M * K) @ rates(membership, H, floor, denom=denom).reshape(M * K)


def cell_weights(membership: Any, alpha: Any, H: Any, lam: Any, floor: float, *, denom: Any = None) -> Any:
    """Per-sample regularizer weights (paper eq. 10), shape (Q, K).

    A row x in cell q contributes ``R_hat(x) = sum_k c[q, k] * sigma_tau(h(x))_k`` (minus
    the constant ``sum_j lam_j gamma_j``), with
    ``c[q, k] = sum_j lam_j sum_{I: q in I} alpha_{j,I,k} / |B_I|`` and ``|B_I|`` read from
    the (noisy) histogram ``H`` and clamped.
    """
    if denom is None:
        denom = denominators(membership, H, floor)
    J, M, K = alpha.shape
    per_subset = (lam @ alpha.reshape(J, M * K)).reshape(M, K)  # sum_j lam_j alpha_{j,I,k}
    return membership.T @ (per_subset / denom[:, None])


def clamp_denominators(denom: np.ndarray, floor: float) -> np.ndarray:
    """Clamp noisy subset counts to a positive floor.

    Laplace noise can make a noisy count ``sum_{i in I} sum_k H_hat[i, k]`` zero or negative;
    dividing by it would flip signs or explode the regularizer.  Clamping is
    post-processing of the private histogram, so it costs no privacy.

    >>> clamp_denominators(np.array([-3.0, 0.0, 0.5, 7.0]), 1.0).tolist()
    [1.0, 1.0, 1.0, 7.0]
    """
    if not floor > 0:
        raise ConfigError(f"method.denominator_floor must be > 0 (got {floor}).")
    return np.maximum(denom, floor) if isinstance(denom, np.ndarray) else denom.clip(min=floor)  # numpy: clip's values, ~3 us faster


def _subset_key(s: frozenset[FineCell]) -> tuple:
    return (len(s), sorted(s))


def complement(cells: Iterable[FineCell], universe: Sequence[FineCell]) -> frozenset[FineCell]:
    """Fine cells of ``universe`` not in ``cells``."""
    cells = set(cells)
    return frozenset(c for c in universe if c not in cells)
