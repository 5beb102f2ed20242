"""psi-divergences of the DRO objective and their convex conjugates (DP-DRO paper, Table 1).

A divergence ``D_psi(p, 1/n) = (1/n) sum_i psi(n p_i)`` is given by a convex ``psi`` on density
ratios ``r = n p_i >= 0`` with ``psi(1) = 0``.  The dual form (paper eq. 3) needs its conjugate
``psi*(s) = sup_{r in dom psi} (s r - psi(r))`` and the derivative ``(psi*)'(s)``, which is the
maximising ratio: the worst-case weight ``r_i = (psi*)'((l_i - eta) / lambda)`` of record i.

Every conjugate below is derived with the constraint ``r >= 0`` (``psi = +inf`` for r < 0, as the
paper's definition requires), so ``(psi*)'`` is a density ratio, never negative.  Two entries
of the paper's Table 1 are corrected (``tests/unit/objectives`` checks every conjugate against a
numerical sup over a grid of r):

* chi^2, ``psi(t) = (t - 1)^2 / 2``: the table's ``-1 + (t + 2)^2 / 4`` is the conjugate of
  ``(t - 1)^2`` without the ``r >= 0`` constraint.  Here ``psi*(s) = ((s + 1)_+^2 - 1) / 2``,
  which is Cressie-Read with k = 2 exactly.
* KL-regularised CVaR, ``psi(t) = I_[0, 1/alpha](t) + t log t - t + 1``: the table's
  ``min(e^s, (1 + s + log alpha) / alpha) - 1`` is always the tangent line (e^s lies above its
  tangent).  The conjugate is ``e^s - 1`` for ``s <= log(1/alpha)`` and the tangent
  ``(1 + s + log alpha) / alpha - 1`` beyond; ``(psi*)'(s) = min(e^s, 1/alpha)`` (1/alpha-smooth).

Exponents are capped at :data:`MAX_EXPONENT` in the per-record terms of training (they are
clipped per record anyway, and an infinite term would be dropped as non-finite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from raco_cli.objectives import DIVERGENCES

MAX_EXPONENT = 60.0  # e^60 ~ 1e26: finite in float32 products, far above any clipping norm


def _exp(s: torch.Tensor) -> torch.Tensor:
    return torch.exp(s.clamp(max=MAX_EXPONENT))


@dataclass(frozen=True)
class Divergence:
    """One psi-divergence: ``psi``, its derivative, the conjugate and the best-response ratio.

    Attributes:
        name: ``chi2``, ``cvar`` (KL-regularised CVaR at level ``alpha``), ``cressie_read``
            (order ``k > 1``) or ``kl``.
        k: Cressie-Read order.
        alpha: CVaR level in (0, 1): the ratios are capped at ``1 / alpha``.
    """

    name: str
    k: float = 2.0
    alpha: float = 0.1

    def __post_init__(self) -> None:
        if self.name not in DIVERGENCES:
            raise ValueError(f"unknown divergence {self.name!r}")

    @property
    def upper(self) -> float:
        """Largest density ratio in ``dom psi`` (inf except CVaR: 1/alpha)."""
        return 1.0 / self.alpha if self.name == "cvar" else math.inf

    def psi(self, r: torch.Tensor) -> torch.Tensor:
        """``psi(r)`` for ratios ``r`` in the domain (no domain check).

        >>> Divergence("chi2").psi(torch.tensor([0.0, 1.0, 3.0])).tolist()
        [0.5, 0.0, 2.0]
        """
        if self.name == "chi2":
            return 0.5 * (r - 1.0) ** 2
        if self.name == "cressie_read":
            k = self.k
            return (r.clamp(min=0.0) ** k - k * r + k - 1.0) / (k * (k - 1.0))
        return torch.xlogy(r, r) - r + 1.0  # kl, cvar: r log r - r + 1 (0 log 0 = 0)

    def psi_grad(self, r: torch.Tensor) -> torch.Tensor:
        """``psi'(r)`` (``-inf`` at r = 0 for kl/cvar)."""
        if self.name == "chi2":
            return r - 1.0
        if self.name == "cressie_read":
            return (r.clamp(min=0.0) ** (self.k - 1.0) - 1.0) / (self.k - 1.0)
        return torch.log(r)

    def conjugate(self, s: torch.Tensor) -> torch.Tensor:
        """``psi*(s) = sup_{r in dom psi} s r - psi(r)`` (module docstring).

        >>> Divergence("kl").conjugate(torch.tensor([0.0])).tolist()
        [0.0]
        """
        if self.name == "chi2":
            return 0.5 * ((s + 1.0).clamp(min=0.0) ** 2 - 1.0)
        if self.name == "cressie_read":
            k = self.k
            return (((k - 1.0) * s + 1.0).clamp(min=0.0) ** (k / (k - 1.0)) - 1.0) / k
        if self.name == "kl":
            return _exp(s) - 1.0
        kink = -math.log(self.alpha)  # cvar: exp below log(1/alpha), its tangent above
        return torch.where(s <= kink, _exp(s.clamp(max=kink)) - 1.0, (1.0 + s + math.log(self.alpha)) / self.alpha - 1.0)

    def ratio(self, s: torch.Tensor) -> torch.Tensor:
        """``(psi*)'(s)``: the maximising density ratio, >= 0.

        >>> Divergence("cvar", alpha=0.5).ratio(torch.tensor([0.0, 5.0])).tolist()
        [1.0, 2.0]
        """
        if self.name == "chi2":
            return (s + 1.0).clamp(min=0.0)
        if self.name == "cressie_read":
            return ((self.k - 1.0) * s + 1.0).clamp(min=0.0) ** (1.0 / (self.k - 1.0))
        if self.name == "kl":
            return _exp(s)
        return _exp(s).clamp(max=1.0 / self.alpha)

    def ascent(self, r: torch.Tensor, score: torch.Tensor, lam: float | torch.Tensor, step: float) -> torch.Tensor:
        """One ascent step of size ``step / lam`` on ``r score - lam psi(r)`` per record
        (``score = l - eta``), i.e. ``r <- r + step (score / lam - psi'(r))``: the iteration then
        contracts at rate ``1 - step`` towards its fixed point whatever lambda is.

        kl / cvar: mirror ascent in ``log r`` (the entropy geometry of the simplex, which keeps
        r > 0); chi2 / Cressie-Read: projected gradient ascent onto ``r >= 0``.  The fixed point
        is the best response ``(psi*)'(score / lam)`` (tested).
        """
        if self.name in ("kl", "cvar"):
            log_r = torch.log(r.clamp(min=1e-30))
            log_r = log_r + step * (score / lam - log_r)
            return _exp(log_r).clamp(max=self.upper)
        return (r + step * (score / lam - self.psi_grad(r))).clamp(min=0.0)


def divergence(name: str, *, k: float = 2.0, alpha: float = 0.1) -> Divergence:
    """The divergence registered under ``name`` (``objective.divergence``)."""
    return Divergence(name, k=k, alpha=alpha)
