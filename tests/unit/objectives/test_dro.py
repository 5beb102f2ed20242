"""DRO formulations: per-record terms against autograd, one saddle point, exact worst case."""

from __future__ import annotations

import math

import pytest
import torch

from raco_cli.errors import ConfigError
from raco_cli.objectives import ObjectiveSpec, objective_spec
from raco_cli.objectives.dro import (
    Compositional,
    DualForm,
    Lagrangian,
    divergence_of,
    kl_to_uniform,
    worst_case,
)

SPECS = [
    ObjectiveSpec("dro", divergence="chi2", lam=0.7),
    ObjectiveSpec("dro", divergence="cvar", lam=0.5, alpha=0.3),
    ObjectiveSpec("dro", divergence="cressie_read", lam=1.2, k=1.5),
    ObjectiveSpec("dro", divergence="kl", lam=0.9, rho=0.3),
]
IDS = [s.divergence for s in SPECS]


def losses(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 3.0).requires_grad_(True)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_dual_form_terms_are_the_autograd_gradients(spec):
    form = DualForm.of(spec)
    ell = losses()
    eta = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    lam = torch.tensor(spec.lam, dtype=torch.float64, requires_grad=True)
    value = lam * form.psi.conjugate((ell - eta) / lam).mean() + eta + (lam * spec.rho if form.variable_lambda else 0.0)
    d_ell, d_eta, d_lam = torch.autograd.grad(value, [ell, eta, lam])
    e, lv = 0.8, spec.lam
    # grad_x L = (1/n) sum_i w_i grad l_i  <=>  dL/dl_i = w_i / n
    torch.testing.assert_close(d_ell * len(ell), form.x_weights(ell.detach(), e, lv))
    grad = form.dual_gradient(form.dual_terms(ell.detach(), e, lv).mean(dim=0))
    torch.testing.assert_close(grad[0], d_eta)
    if form.variable_lambda:
        torch.testing.assert_close(grad[1], d_lam)
    torch.testing.assert_close(form.value(ell.detach(), e, lv), value.detach())


def test_compositional_direction_is_the_gradient_of_eq5():
    spec = SPECS[-1]
    comp = Compositional.of(spec)
    ell = losses()
    lam = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
    psi = lam * torch.log(torch.exp(ell / lam).mean()) + lam * spec.rho
    d_ell, d_lam = torch.autograd.grad(psi, [ell, lam])
    e = ell.detach()
    s, b = float(comp.g(e, 0.9).mean()), float(comp.lam_terms(e, 0.9).mean())
    # a = mean g_i grad l_i: represent grad l_i by unit vectors (column i: dPsi/dl_i)
    a = [torch.diag(comp.x_weights(e, 0.9)) / len(e)]
    zx, zl = comp.direction(s, a, b, 0.9)
    torch.testing.assert_close(zx[0].sum(dim=0), d_ell)
    assert zl == pytest.approx(float(d_lam), rel=1e-10)
    assert float(comp.value(e, 0.9)) == pytest.approx(float(psi.detach()), rel=1e-12)
    for shift in (0.7, -2.0, 3.5):  # any shift c of g gives the same direction (module docstring)
        s_c, b_c = float(comp.g(e, 0.9, shift).mean()), float(comp.lam_terms(e, 0.9, shift).mean())
        zx_c, zl_c = comp.direction(s_c, [torch.diag(comp.x_weights(e, 0.9, shift)) / len(e)], b_c, 0.9)
        torch.testing.assert_close(zx_c[0], zx[0])
        assert zl_c == pytest.approx(zl, rel=1e-9)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_lagrangian_best_response_gives_back_the_dual_form(spec):
    lag, form = Lagrangian.of(spec), DualForm.of(spec)
    ell = losses().detach()
    eta, lam = 0.6, spec.lam
    r = form.psi.ratio((ell - eta) / lam)  # the max over r, record by record
    torch.testing.assert_close(lag.dual_gradient(lag.dual_terms(r).mean(dim=0)), form.dual_gradient(form.dual_terms(ell, eta, lam).mean(dim=0)))
    lagrangian = (r * (ell - eta) - lam * lag.psi.psi(r)).mean() + eta + (lam * spec.rho if lag.variable_lambda else 0.0)
    torch.testing.assert_close(lagrangian, form.value(ell, eta, lam))


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_worst_case_is_the_maximum_over_the_simplex(spec):
    ell = losses(n=25, seed=3).detach()
    wc = worst_case(ell, spec)
    p = wc.weights
    assert float(p.sum()) == pytest.approx(1.0) and (p >= 0).all()
    psi, n = divergence_of(spec), len(ell)
    if spec.compositional:  # KL ball of radius rho: p* is on the boundary and beats random points inside
        assert kl_to_uniform(ell, wc.lam) == pytest.approx(spec.rho, abs=1e-8)
        assert float(p @ ell) == pytest.approx(wc.value, rel=1e-8)
        # eq. 5 at lambda*: the minimum over a lambda grid
        grid = torch.logspace(-3, 2, 2000, dtype=torch.float64)
        assert min(float(Compositional.of(spec).value(ell, float(g))) for g in grid) >= wc.value - 1e-6
        g = torch.Generator().manual_seed(0)
        for _ in range(200):
            q = torch.softmax(torch.randn(n, generator=g, dtype=torch.float64) * 0.5 + ell / wc.lam, dim=0)
            if float((q * torch.log(q * n)).sum()) <= spec.rho:
                assert float(q @ ell) <= wc.value + 1e-9
        return
    penalised = float(p @ ell - spec.lam * psi.psi(n * p).mean())
    assert penalised == pytest.approx(wc.value, abs=1e-7)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):  # any other distribution in the domain does worse
        q = (p + 0.05 * torch.rand(n, generator=g, dtype=torch.float64)).clamp(min=0)
        q = q / q.sum()
        if (n * q <= psi.upper).all():
            assert float(q @ ell - spec.lam * psi.psi(n * q).mean()) <= wc.value + 1e-9
    # and it is the minimum over eta of eq. 3
    grid = torch.linspace(float(ell.min()) - 1, float(ell.max()) + 1, 4001, dtype=torch.float64)
    form = DualForm.of(spec)
    assert min(float(form.value(ell, float(e), spec.lam)) for e in grid) == pytest.approx(wc.value, abs=1e-5)


def test_gradient_of_F_is_the_worst_case_weighted_gradient():
    """Danskin: grad F(x) = sum_i p*_i grad l_i, against central finite differences of F."""
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(30, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (30,), generator=g)
    W = torch.randn(2, 3, generator=g, dtype=torch.float64)
    for spec in SPECS:
        def F(w, spec=spec):
            return worst_case(torch.nn.functional.cross_entropy(X @ w.t(), y, reduction="none"), spec).value

        Wr = W.clone().requires_grad_(True)
        ell = torch.nn.functional.cross_entropy(X @ Wr.t(), y, reduction="none")
        p = worst_case(ell.detach(), spec).weights
        (grad,) = torch.autograd.grad((p * ell).sum(), Wr)
        fd = torch.zeros_like(W)
        h = 1e-5
        for i in range(2):
            for j in range(3):
                e = torch.zeros_like(W)
                e[i, j] = h
                fd[i, j] = (F(W + e) - F(W - e)) / (2 * h)
        torch.testing.assert_close(grad, fd, atol=2e-5, rtol=1e-4)


def test_objective_spec_messages():
    assert objective_spec(None).name == "erm"
    assert objective_spec({"name": "dro", "lambda": 2}).lam == 2.0
    cases = [
        ({"name": "dro", "divergence": "hellinger"}, "objective.divergence must be one of chi2, cvar, cressie_read, kl (got objective.divergence='hellinger'); the psi-divergence of the uncertainty set (paper Table 1)."),
        ({"name": "dro", "k": 1}, "objective.k must be a finite number > 1 (got objective.k=1.0); the Cressie-Read order."),
        ({"name": "dro", "rho": 0}, "objective.rho must be a finite number > 0 (got objective.rho=0.0); the radius of the KL uncertainty set."),
        ({"name": "dro", "alpha": 1.5}, "objective.alpha must be in (0, 1) (got objective.alpha=1.5); the CVaR level (worst-case weights are capped at 1/alpha)."),
        ({"name": "dro", "lambda": 1e-4}, "objective.lambda must be >= objective.lambda0 for divergence=kl (got objective.lambda=0.0001, objective.lambda0=0.001); it is the initial lambda of eq. 5."),
        ({"name": "dro", "radius": 1}, "Unknown key objective.radius. Allowed: objective.name, objective.divergence, objective.lambda, objective.rho, objective.lambda0, objective.k, objective.alpha."),
    ]
    for cfg, message in cases:
        with pytest.raises(ConfigError) as info:
            objective_spec(cfg)
        assert str(info.value) == message


def test_kl_lambda_hits_its_floor_when_the_ball_is_large():
    ell = torch.tensor([0.0, 0.1, 0.2], dtype=torch.float64)
    spec = ObjectiveSpec("dro", divergence="kl", rho=5.0, lambda0=0.01, lam=1.0)
    wc = worst_case(ell, spec)
    assert wc.lam == 0.01 and math.isfinite(wc.value)
