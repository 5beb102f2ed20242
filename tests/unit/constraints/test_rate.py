"""Rate constraints: partition derivation, Gamma_post, regularizer weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raco_cli.constraints import ConstraintSet, RateConstraint, RateTerm, build, clamp_denominators
from raco_cli.constraints.rate import cell_weights, denominators, gamma_post
from raco_cli.errors import ConfigError


def direct_dp_values(pred_probs, group, n_groups, n_classes):
    """Gamma_{z,k} = P_k(D[Z=z]) - P_k(D[Z!=z]) computed directly from rows."""
    out = []
    for z in range(n_groups):
        for k in range(n_classes):
            out.append(pred_probs[group == z, k].mean() - pred_probs[group != z, k].mean())
    return np.array(out)


@pytest.mark.parametrize("n_groups,n_classes", [(2, 2), (3, 2), (4, 3)])
def test_dp_counts_and_partition(n_groups, n_classes):
    cs = build("dp", n_classes=n_classes, n_groups=n_groups, gamma=0.1)
    assert cs.J == n_groups * n_classes  # paper Table 1
    assert cs.Q == n_groups  # partition by group
    assert (cs.cell_of == np.arange(n_groups)[None, :]).all()


@pytest.mark.parametrize("n_groups,n_classes", [(2, 2), (3, 2), (4, 3)])
def test_gamma_post_on_exact_histogram_equals_direct_rates(n_groups, n_classes):
    rng = np.random.default_rng(0)
    n = 500
    group = rng.integers(0, n_groups, n)
    y = rng.integers(0, n_classes, n)
    probs = rng.dirichlet(np.ones(n_classes), n)
    cs = build("dp", n_classes=n_classes, n_groups=n_groups, gamma=0.0)
    H = cs.histogram(probs, cs.cells(y, group))
    np.testing.assert_allclose(cs.gamma_post(H, floor=None), direct_dp_values(probs, group, n_groups, n_classes), atol=1e-12)
    # hard rates too
    hard = np.eye(n_classes)[probs.argmax(1)]
    H = cs.histogram(hard, cs.cells(y, group))
    np.testing.assert_allclose(cs.gamma_post(H, floor=None), direct_dp_values(hard, group, n_groups, n_classes), atol=1e-12)


def test_rigged_rates(rigged):
    y, group, pred = rigged
    cs = build("dp", n_classes=2, n_groups=2, gamma=0.05)
    H = cs.histogram(np.eye(2)[pred], cs.cells(y, group))
    # P(pred=1|g0) = 0.75, P(pred=1|g1) = 0.25
    np.testing.assert_allclose(cs.gamma_post(H, floor=None), [-0.5, 0.5, 0.5, -0.5])


def test_histogram_l1_sensitivity_is_one():
    """Adding or removing one row changes H by at most 1 in l1 norm (paper Section 4.1)."""
    rng = np.random.default_rng(1)
    cs = build("dp", n_classes=3, n_groups=4, gamma=0.0)
    for _ in range(50):
        n = rng.integers(1, 30)
        probs = rng.dirichlet(np.ones(3), n)
        y, group = rng.integers(0, 3, n), rng.integers(0, 4, n)
        full = cs.histogram(probs, cs.cells(y, group))
        drop = rng.integers(0, n)
        keep = np.arange(n) != drop
        neighbour = cs.histogram(probs[keep], cs.cells(y[keep], group[keep]))
        assert np.abs(full - neighbour).sum() <= 1.0 + 1e-12


def test_smallest_partition_merges_cells_used_identically():
    # a constraint over label-1 rows only (FNR-like): fine cells with y=1 vs y=0
    universe_pos = frozenset({(1, 0), (1, 1)})
    c = RateConstraint("fnr", (RateTerm(universe_pos, 0, 1.0),), gamma=0.2)
    cs = ConstraintSet.build([c], n_classes=2, n_groups=2)
    assert cs.Q == 2
    assert cs.cell_of[1, 0] == cs.cell_of[1, 1] != cs.cell_of[0, 0] == cs.cell_of[0, 1]


def test_cell_weights_are_the_gradient_of_the_regularizer():
    """sum_i c[cell_i] . sigma(z_i) has the same z-gradient as the mini-batch regularizer R(theta, lambda; B)
    written with the histogram denominators (paper eq. 10)."""
    rng = np.random.default_rng(2)
    cs = build("dp", n_classes=2, n_groups=3, gamma=0.05)
    n = 40
    group = rng.integers(0, 3, n)
    y = rng.integers(0, 2, n)
    z = torch.tensor(rng.normal(size=(n, 2)), requires_grad=True)
    lam = rng.random(cs.J)
    probs = torch.softmax(z, 1)
    H = cs.histogram(probs.detach().numpy(), cs.cells(y, group))  # exact H of this batch, fixed denominators
    denom = torch.tensor(cs.denominators(H, floor=1.0))
    numer = torch.tensor(cs.membership) @ torch.zeros(cs.Q, 2, dtype=torch.float64).index_add(0, torch.tensor(cs.cells(y, group)), probs)
    R = (torch.tensor(lam) * (torch.einsum("jmk,mk->j", torch.tensor(cs.alpha), numer / denom[:, None]) - torch.tensor(cs.gamma))).sum()
    R.backward()
    c = cs.cell_weights(H, lam, floor=1.0)[cs.cells(y, group)]
    z2 = z.detach().clone().requires_grad_(True)
    (torch.tensor(c) * torch.softmax(z2, 1)).sum().backward()
    np.testing.assert_allclose(z2.grad.numpy(), z.grad.numpy(), atol=1e-12)


def test_clamp_denominators():
    np.testing.assert_array_equal(clamp_denominators(np.array([-5.0, 0.0, 0.3, 2.0]), 1.0), [1.0, 1.0, 1.0, 2.0])
    with pytest.raises(ConfigError):
        clamp_denominators(np.array([1.0]), 0.0)


def test_noisy_negative_denominators_give_finite_values():
    cs = build("dp", n_classes=2, n_groups=2, gamma=0.05)
    H = np.array([[-3.0, 0.5], [1.0, -2.0]])
    assert np.isfinite(cs.gamma_post(H, floor=1.0)).all()
    assert np.isfinite(cs.cell_weights(H, np.ones(4), floor=1.0)).all()


def test_gamma_must_be_non_negative_exact_message():
    with pytest.raises(ConfigError) as info:
        build("dp", n_classes=2, n_groups=2, gamma=-0.05)
    assert str(info.value) == "constraint.gamma must be >= 0 (got -0.05); gamma is the allowed gap of each rate constraint."


def test_unknown_constraint_message():
    with pytest.raises(ConfigError, match=r"^Unknown constraint 'dq'\. Available: "):
        build("dq", n_classes=2, n_groups=2, gamma=0.1)


def test_torch_and_numpy_maths_agree():
    cs = build("dp", n_classes=3, n_groups=3, gamma=0.05)
    rng = np.random.default_rng(3)
    H, lam = rng.normal(3, 2, size=(3, 3)), rng.random(cs.J)
    w, g = cs.to_torch("cpu").step(torch.tensor(H), torch.tensor(lam), floor=1.0)  # numpy arrays on the CPU
    np.testing.assert_allclose(w, cs.cell_weights(H, lam, floor=1.0))
    np.testing.assert_allclose(g, cs.gamma_post(H, floor=1.0) - cs.gamma)
    # the torch maths (an accelerator's path), on CPU tensors
    t = cs.to_torch("cpu")
    H_t, lam_t = torch.tensor(H), torch.tensor(lam)
    denom = denominators(t.membership, H_t, 1.0)
    np.testing.assert_allclose(cell_weights(t.membership, t.alpha, H_t, lam_t, 1.0, denom=denom).numpy(), w)
    np.testing.assert_allclose((gamma_post(t.membership, t.alpha, H_t, 1.0, denom=denom) - t.gamma).numpy(), g)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 5), st.integers(2, 3), st.integers(0, 10_000))
def test_rates_in_unit_interval_and_permutation_invariant(n_groups, n_classes, seed):
    rng = np.random.default_rng(seed)
    n = 60
    group, y = rng.integers(0, n_groups, n), rng.integers(0, n_classes, n)
    probs = rng.dirichlet(np.ones(n_classes), n)
    cs = build("dp", n_classes=n_classes, n_groups=n_groups, gamma=0.0)
    H = cs.histogram(probs, cs.cells(y, group))
    r = cs.rates(H, floor=None)
    finite = r[np.isfinite(r)]
    assert ((finite >= -1e-12) & (finite <= 1 + 1e-12)).all()
    perm = rng.permutation(n)
    H2 = cs.histogram(probs[perm], cs.cells(y[perm], group[perm]))
    np.testing.assert_allclose(cs.gamma_post(H, floor=None), cs.gamma_post(H2, floor=None), equal_nan=True)
