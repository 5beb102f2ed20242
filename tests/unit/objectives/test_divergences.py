"""psi-divergences: conjugates against a numerical sup, ratios against autograd, ascent fixed points."""

from __future__ import annotations

import math

import pytest
import torch

from raco_cli.objectives.divergences import Divergence

DIVS = [Divergence("chi2"), Divergence("kl"), Divergence("cvar", alpha=0.2), Divergence("cressie_read", k=1.5),
        Divergence("cressie_read", k=3.0)]
S = torch.linspace(-3.0, 2.5, 23, dtype=torch.float64)


def numerical_conjugate(div: Divergence, s: torch.Tensor) -> torch.Tensor:
    """sup over a fine grid of ratios r in dom psi (r >= 0, r <= 1/alpha for CVaR)."""
    upper = min(div.upper, 40.0)
    r = torch.linspace(0.0, upper, 400_001, dtype=torch.float64)
    values = s[:, None] * r[None, :] - div.psi(r)[None, :]
    return values.max(dim=1).values


@pytest.mark.parametrize("div", DIVS, ids=lambda d: f"{d.name}-{d.k}-{d.alpha}")
def test_conjugate_is_the_sup_over_the_domain(div):
    torch.testing.assert_close(div.conjugate(S), numerical_conjugate(div, S), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("div", DIVS, ids=lambda d: f"{d.name}-{d.k}-{d.alpha}")
def test_ratio_is_the_derivative_of_the_conjugate_and_a_density_ratio(div):
    s = S.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(div.conjugate(s).sum(), s)
    torch.testing.assert_close(div.ratio(S), grad, atol=1e-9, rtol=1e-9)
    assert (div.ratio(S) >= 0).all() and (div.ratio(S) <= div.upper).all()
    assert float(div.ratio(torch.zeros(1, dtype=torch.float64))) == pytest.approx(1.0)  # psi'(1) = 0


def test_chi2_is_cressie_read_of_order_two_and_table1_typos_are_corrected():
    torch.testing.assert_close(Divergence("chi2").conjugate(S), Divergence("cressie_read", k=2.0).conjugate(S))
    # Table 1's chi^2 conjugate -1 + (s+2)^2/4 ignores r >= 0 (and is the conjugate of (t-1)^2)
    table = -1.0 + 0.25 * (S + 2.0) ** 2
    assert not torch.allclose(Divergence("chi2").conjugate(S), table)
    # Table 1's CVaR min(e^s, (1+s+log a)/a) - 1 is the tangent line everywhere
    a = 0.2
    tangent = (1.0 + S + math.log(a)) / a - 1.0
    table_cvar = torch.minimum(torch.exp(S), tangent + 1.0) - 1.0
    torch.testing.assert_close(table_cvar, tangent)
    assert not torch.allclose(Divergence("cvar", alpha=a).conjugate(S), tangent)


@pytest.mark.parametrize("div", DIVS, ids=lambda d: f"{d.name}-{d.k}-{d.alpha}")
def test_ascent_converges_to_the_best_response(div):
    score = torch.tensor([-2.0, -0.3, 0.0, 0.4, 1.5], dtype=torch.float64)
    lam = 0.8
    r = torch.ones_like(score)
    for _ in range(4000):
        r = div.ascent(r, score, lam, step=0.05)
    torch.testing.assert_close(r, div.ratio(score / lam), atol=1e-6, rtol=1e-6)


def test_huge_scores_stay_finite():
    big = torch.tensor([1e4, 1e8], dtype=torch.float32)  # losses far beyond any clipping norm
    for div in DIVS:
        assert torch.isfinite(div.ratio(big)).all() and torch.isfinite(div.conjugate(big)).all()
