"""Per-record pieces of the DRO objective for the three formulations the methods use.

Notation: ``l_i = l(x; xi_i)`` the loss of record i, ``n`` records, lambda the divergence weight.

* :class:`DualForm`, paper eq. 3 (Algorithm 2, DP Double-SPIDER)::

      L(x, eta[, lambda]) = (1/n) sum_i [lambda psi*(u_i) + eta] (+ lambda rho),   u_i = (l_i - eta) / lambda

  ``grad_x L = (1/n) sum_i w_i grad l_i`` with ``w_i = (psi*)'(u_i)``; the dual block is eta
  (fixed lambda) or (eta, lambda) for the KL-constrained problem, whose minimum over eta is
  eq. 5 exactly (``psi*(s) = e^s - 1``): ``dL/deta = 1 - mean (psi*)'(u_i)`` and
  ``dL/dlambda = mean [psi*(u_i) - u_i (psi*)'(u_i)] + rho``.
* :class:`Compositional`, eq. 5 as ``f(g(w))`` (Algorithm 3, DP Recursive-SPIDER):
  ``g_i = exp(l_i / lambda)``, ``grad_x g_i = g_i / lambda grad l_i``,
  ``d g_i / d lambda = -g_i l_i / lambda^2``; ``grad_x Psi = (lambda / s) v`` and
  ``d Psi / d lambda = (lambda / s) u + log s + rho`` (line 18) for estimates s, v, u of the
  means of g, grad_x g, dg/dlambda (the methods estimate lambda v and lambda^2 u, see
  :meth:`Compositional.direction`).
* :class:`Lagrangian`, the minimax form of eq. 2 for SGDA, with the simplex constraint
  ``sum_i p_i = 1`` moved into a multiplier eta (the same eta as eq. 3) and the weights kept as
  per-record density ratios ``r_i = n p_i >= 0``::

      L(x, eta[, lambda]; r) = (1/n) sum_i [r_i (l_i - eta) - lambda psi(r_i)] + eta (+ lambda rho)

  min over (x, eta[, lambda]), max over r.  The max over r decouples record by record and its
  solution is ``r_i = (psi*)'(u_i)``, which gives back eq. 3: the three forms share one saddle
  point and one value F(x).

:func:`worst_case` solves the inner problem exactly on a set of losses (evaluation): the
optimal eta (or lambda), the worst-case distribution p* and F(x); ``grad F(x) = sum_i p*_i grad l_i``
(Danskin), whose norm is the stationarity measure of the paper (Definition 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import torch

from raco_cli.objectives import ObjectiveSpec
from raco_cli.objectives.divergences import MAX_EXPONENT, Divergence, divergence


def divergence_of(spec: ObjectiveSpec) -> Divergence:
    return divergence(spec.divergence, k=spec.k, alpha=spec.alpha)


Form = TypeVar("Form", bound="DualBlock")


@dataclass(frozen=True)
class DualBlock:
    """What :class:`DualForm` and :class:`Lagrangian` share: the divergence psi, the radius rho,
    and lambda, fixed at ``lambda0`` or (the KL-constrained problem, ``variable_lambda``) a dual
    variable of its own beside eta: the dual block is ``(eta,)`` or ``(eta, lambda)``."""

    psi: Divergence
    rho: float
    lambda0: float
    variable_lambda: bool

    @classmethod
    def of(cls: type[Form], spec: ObjectiveSpec) -> Form:
        return cls(divergence_of(spec), rho=spec.rho, lambda0=spec.lambda0, variable_lambda=spec.compositional)

    @property
    def dual_dim(self) -> int:
        return 2 if self.variable_lambda else 1


@dataclass(frozen=True)
class DualForm(DualBlock):
    """Paper eq. 3 (and eq. 5 through it for kl): the dual block is ``(eta,)`` or ``(eta, lambda)``."""

    def x_weights(self, ell: torch.Tensor, eta: float, lam: float) -> torch.Tensor:
        """``w_i = (psi*)'(u_i)``: ``grad_x L_i = w_i grad l_i``."""
        return self.psi.ratio((ell - eta) / lam)

    def dual_terms(self, ell: torch.Tensor, eta: float, lam: float) -> torch.Tensor:
        """Per-record data terms of the dual gradient, (b, dual_dim): ``(psi*)'(u_i)`` and (kl)
        ``psi*(u_i) - u_i (psi*)'(u_i)``; :meth:`dual_gradient` maps their mean to the gradient."""
        u = (ell - eta) / lam
        r = self.psi.ratio(u)
        if not self.variable_lambda:
            return r[:, None]
        return torch.stack([r, self.psi.conjugate(u) - u * r], dim=1)

    def dual_gradient(self, mean_terms: torch.Tensor) -> torch.Tensor:
        """``(dL/deta[, dL/dlambda])`` from the (noisy) mean of :meth:`dual_terms`."""
        out = torch.empty_like(mean_terms)
        out[0] = 1.0 - mean_terms[0]
        if self.variable_lambda:
            out[1] = mean_terms[1] + self.rho
        return out

    def value(self, ell: torch.Tensor, eta: float, lam: float) -> torch.Tensor:
        """``L(x, eta[, lambda])`` on the records of ``ell``."""
        out = lam * self.psi.conjugate((ell - eta) / lam).mean() + eta
        return out + lam * self.rho if self.variable_lambda else out


@dataclass(frozen=True)
class Compositional:
    """Eq. 5 as a compositional problem ``f(g(w))``, ``w = (x, lambda)`` (Algorithm 3)."""

    rho: float
    lambda0: float

    @classmethod
    def of(cls, spec: ObjectiveSpec) -> Compositional:
        return cls(rho=spec.rho, lambda0=spec.lambda0)

    @staticmethod
    def g(ell: torch.Tensor, lam: float, shift: float = 0.0) -> torch.Tensor:
        """``g(w; xi_i) = exp((l_i - c) / lambda)`` (exponent capped at MAX_EXPONENT).

        The paper's g has c = 0.  Any constant shift c leaves the gradient of eq. 5 unchanged
        (``Psi = c + lambda log mean exp((l - c)/lambda) + lambda rho`` and the c terms of
        line 18 cancel; tested), and c near ``lambda log mean exp(l / lambda)`` keeps g near 1,
        where a fixed clipping norm does not truncate it."""
        return torch.exp(((ell - shift) / lam).clamp(max=MAX_EXPONENT))

    def x_weights(self, ell: torch.Tensor, lam: float, shift: float = 0.0) -> torch.Tensor:
        """``a_i = g_i grad l_i = lambda grad_x g_i``: the weights ``g_i`` of ``grad l_i``."""
        return self.g(ell, lam, shift)

    def lam_terms(self, ell: torch.Tensor, lam: float, shift: float = 0.0) -> torch.Tensor:
        """``b_i = -g_i (l_i - c) = lambda^2 d g_i / d lambda`` (c held fixed)."""
        return -self.g(ell, lam, shift) * (ell - shift)

    def direction(self, s: float, a: list[torch.Tensor], b: float, lam: float) -> tuple[list[torch.Tensor], float]:
        """``z_t`` of Algorithm 3 line 18, ``(grad f(s) v, grad f(s) u + log s + rho)`` with
        ``grad f(g) = (log g_2 + rho, g_1 / g_2)`` at ``g = (lambda, s)``, from estimates
        ``a ~ mean g_i grad l_i = lambda v`` and ``b ~ mean -g_i (l_i - c) = lambda^2 u``:
        ``(a / s, b / (lambda s) + log s + rho)``.  Estimating lambda v and lambda^2 u instead of
        v and u (the public lambda rescales each record's term) keeps the per-record terms of
        order g whatever lambda is, so a fixed clipping norm does not truncate them as lambda
        falls."""
        return [t / s for t in a], b / (lam * s) + math.log(s) + self.rho

    def value(self, ell: torch.Tensor, lam: float) -> torch.Tensor:
        """``Psi(x, lambda) = lambda log mean exp(l_i / lambda) + lambda rho`` (stable log-sum-exp)."""
        return lam * (torch.logsumexp(ell / lam, dim=0) - math.log(len(ell))) + lam * self.rho


@dataclass(frozen=True)
class Lagrangian(DualBlock):
    """Eq. 2 as a minimax problem over (x, eta[, lambda]) and per-record ratios r (SGDA)."""

    def dual_terms(self, r: torch.Tensor) -> torch.Tensor:
        """Per-record data terms of the (eta[, lambda]) gradient, (b, dual_dim): ``r_i`` and
        (kl) ``psi(r_i)``; ``dL/deta = 1 - mean r``, ``dL/dlambda = rho - mean psi(r)``."""
        if not self.variable_lambda:
            return r[:, None]
        return torch.stack([r, self.psi.psi(r)], dim=1)

    def dual_gradient(self, mean_terms: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(mean_terms)
        out[0] = 1.0 - mean_terms[0]
        if self.variable_lambda:
            out[1] = self.rho - mean_terms[1]
        return out

    def ascent(self, r: torch.Tensor, ell: torch.Tensor, eta: float, lam: float, step: float) -> torch.Tensor:
        """One ascent step of the ratios of the sampled records (their own hidden state)."""
        return self.psi.ascent(r, ell - eta, lam, step)


@dataclass(frozen=True)
class WorstCase:
    """The exact inner solution on a set of losses: ``F = sum_i p_i l_i - lambda D(p)``.

    Attributes:
        weights: p* (n,), the worst-case distribution (sums to 1).
        value: F(x).
        eta: the optimal eta of eq. 3 (kl: of the optimal lambda).
        lam: lambda (fixed, or the optimal lambda >= lambda0 of eq. 5).
    """

    weights: torch.Tensor
    value: float
    eta: float
    lam: float


def worst_case(ell: torch.Tensor, spec: ObjectiveSpec, *, iters: int = 200) -> WorstCase:
    """Solve the inner problem of ``spec`` exactly on losses ``ell`` (float64 bisection).

    Fixed lambda: ``eta*`` is the root of ``mean (psi*)'((l_i - eta)/lambda) = 1``, increasing in
    eta and bracketed by [min l, max l]; kl (eq. 5): ``lambda*`` is where ``KL(softmax(l/lambda) ||
    uniform) = rho`` (that KL falls as lambda grows), or lambda0 when the KL is already below
    rho there.

    >>> wc = worst_case(torch.tensor([0.0, 1.0]), ObjectiveSpec("dro", divergence="chi2", lam=1.0))
    >>> [round(v, 6) for v in wc.weights.tolist()], round(wc.value, 6)
    ([0.25, 0.75], 0.625)
    """
    ell = ell.detach().double()
    n = len(ell)
    if spec.compositional:
        lam = _kl_lambda(ell, spec.rho, spec.lambda0, iters)
        weights = torch.softmax(ell / lam, dim=0)
        lse = float(torch.logsumexp(ell / lam, dim=0)) - math.log(n)
        return WorstCase(weights=weights, value=lam * lse + lam * spec.rho, eta=lam * lse, lam=lam)
    psi, lam = divergence_of(spec), spec.lam
    lo, hi = float(ell.min()), float(ell.max())
    for _ in range(iters):  # invariant: mean ratio >= 1 at lo, <= 1 at hi
        mid = 0.5 * (lo + hi)
        if float(psi.ratio((ell - mid) / lam).mean()) > 1.0:
            lo = mid
        else:
            hi = mid
    eta = 0.5 * (lo + hi)
    r = psi.ratio((ell - eta) / lam)
    weights = r / r.sum() if float(r.sum()) > 0 else torch.full_like(ell, 1.0 / n)
    value = float(lam * psi.conjugate((ell - eta) / lam).mean() + eta)
    return WorstCase(weights=weights, value=value, eta=eta, lam=lam)


def kl_to_uniform(ell: torch.Tensor, lam: float) -> float:
    """``KL(softmax(l / lambda) || uniform)``, stable for small lambda."""
    logp = torch.log_softmax(ell / lam, dim=0)
    return float((logp.exp() * logp).sum()) + math.log(len(ell))


def _kl_lambda(ell: torch.Tensor, rho: float, lambda0: float, iters: int) -> float:
    if kl_to_uniform(ell, lambda0) <= rho:
        return lambda0
    lo, hi = lambda0, max(lambda0, 1.0)
    while kl_to_uniform(ell, hi) > rho:  # KL -> 0 as lambda -> inf
        lo, hi = hi, hi * 2.0
    for _ in range(iters):  # KL(lo) > rho >= KL(hi), bisection in log lambda
        mid = math.sqrt(lo * hi)
        if kl_to_uniform(ell, mid) > rho:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-12:
            break
    return hi
