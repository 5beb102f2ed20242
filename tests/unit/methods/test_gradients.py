"""Per-sample gradient engines against a direct per-sample autograd computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from raco_cli.methods.gradients import FunctionalEngine, LinearEngine, row_softmax


def naive_clipped_sum(model, X, y, c, *, reg_scale, tau, clip):
    """One backward pass per row, then clip and sum (the definition)."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(y)):
        model.zero_grad()
        z = model(X[i : i + 1])
        loss = nn.functional.cross_entropy(z, y[i : i + 1])
        if c is not None:
            loss = loss + reg_scale * (c[i] * torch.softmax(tau * z, dim=1)[0]).sum()
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        factor = min(1.0, clip / float(norm)) if clip is not None else 1.0
        for t, g in zip(total, grads):
            t += factor * g
    return total


def setup(n=37, d=5, K=3, seed=0):
    torch.manual_seed(seed)
    X = torch.randn(n, d)
    y = torch.randint(0, K, (n,))
    c = torch.randn(n, K)
    return X, y, c


@pytest.mark.parametrize("clip", [None, 0.5, 5.0])
@pytest.mark.parametrize("with_reg", [False, True])
def test_linear_closed_form_equals_naive(clip, with_reg):
    X, y, c = setup()
    layer = nn.Linear(5, 3)
    model = nn.Sequential(layer)
    c = c if with_reg else None
    ours = LinearEngine(layer).clipped_sum(X, y, c, reg_scale=7.0, temperature=2.0, clip_norm=clip)
    ref = naive_clipped_sum(model, X, y, c, reg_scale=7.0, tau=2.0, clip=clip)
    for a, b in zip(ours.grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_linear_engine_given_the_tempered_softmax_equals_the_naive_sum(tau):
    """raco_dp's step hands the engine ``softmax(tau z)`` it computed for its histogram
    (``probs=``): the clipped sum is the definition's, including a non-finite row dropped
    (its NaN probabilities stay NaN, so the row is counted and left out, not kept as a finite one)."""
    X, y, c = setup(n=12)
    layer = nn.Linear(5, 3)
    eng = LinearEngine(layer)
    z = eng.logits(X).detach()
    ours = eng.clipped_sum(X, y, c, reg_scale=7.0, temperature=tau, clip_norm=0.5, probs=row_softmax(z, tau))
    ref = naive_clipped_sum(nn.Sequential(layer), X, y, c, reg_scale=7.0, tau=tau, clip=0.5)
    for a, b in zip(ours.grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    X[4, 0] = float("nan")
    z = eng.logits(X).detach()
    bad = eng.clipped_sum(X, y, c, reg_scale=7.0, temperature=tau, clip_norm=0.5, probs=row_softmax(z, tau))
    keep = torch.arange(12) != 4
    ref = eng.clipped_sum(X[keep], y[keep], c[keep], reg_scale=7.0, temperature=tau, clip_norm=0.5)
    assert int(bad.nonfinite) == 1
    for a, b in zip(bad.grads, ref.grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("micro_batch", [1, 8, 1000])
def test_functional_engine_equals_naive_for_any_micro_batch(micro_batch):
    X, y, c = setup(n=23)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    ours = FunctionalEngine(model, micro_batch=micro_batch).clipped_sum(X, y, c, reg_scale=3.0, temperature=1.0, clip_norm=0.7)
    ref = naive_clipped_sum(model, X, y, c, reg_scale=3.0, tau=1.0, clip=0.7)
    for a, b in zip(ours.grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_engines_agree_on_a_linear_model():
    X, y, c = setup(n=64)
    layer = nn.Linear(5, 3)
    a = LinearEngine(layer).clipped_sum(X, y, c, reg_scale=2.0, temperature=1.5, clip_norm=1.0)
    b = FunctionalEngine(nn.Sequential(layer), micro_batch=16).clipped_sum(X, y, c, reg_scale=2.0, temperature=1.5, clip_norm=1.0)
    for u, v in zip(a.grads, b.grads):
        torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6)
    assert int(a.clipped) == int(b.clipped)


def test_clipped_sum_norm_is_bounded_per_row():
    X, y, c = setup(n=50)
    X = X * 100  # force clipping
    layer = nn.Linear(5, 3)
    for i in range(5):
        res = LinearEngine(layer).clipped_sum(X[i : i + 1], y[i : i + 1], c[i : i + 1], reg_scale=10.0, temperature=1.0, clip_norm=0.3)
        norm = torch.sqrt(sum((g**2).sum() for g in res.grads))
        assert float(norm) <= 0.3 + 1e-6


@pytest.mark.parametrize("engine", ["linear", "functional"])
def test_non_finite_rows_are_dropped_not_propagated(engine):
    """Rows with a NaN or an infinite feature reach each engine as they are: they are counted,
    dropped from the sum (which equals the sum over the other rows) and never make it NaN."""
    X, y, c = setup(n=10)
    X[3, 0] = float("nan")
    X[7, 1] = float("inf")
    layer = nn.Linear(5, 3)
    eng = LinearEngine(layer) if engine == "linear" else FunctionalEngine(nn.Sequential(layer), micro_batch=4)
    res = eng.clipped_sum(X, y, c, reg_scale=1.0, temperature=1.0, clip_norm=1.0)
    assert int(res.nonfinite) == 2
    assert all(torch.isfinite(g).all() for g in res.grads)
    keep = torch.tensor([i not in (3, 7) for i in range(10)])
    ref = eng.clipped_sum(X[keep], y[keep], c[keep], reg_scale=1.0, temperature=1.0, clip_norm=1.0)
    assert int(ref.nonfinite) == 0
    for a, b in zip(res.grads, ref.grads):
        torch.testing.assert_close(a, b)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20), drop=st.integers(0, 19), clip=st.sampled_from([0.05, 1.0, 30.0]), scale=st.sampled_from([0.1, 10.0]),
       seed=st.integers(0, 10**6), functional=st.booleans())
def test_clipped_sum_moves_by_at_most_c_when_a_row_is_removed(n, drop, clip, scale, seed, functional):
    """Add/remove adjacency: the clipped sum of a batch and of the batch without one row differ
    by at most C in l2 over all parameters (the Gaussian release's sensitivity)."""
    gen = torch.Generator().manual_seed(seed)
    X = scale * torch.randn(n, 5, generator=gen)
    y = torch.randint(0, 3, (n,), generator=gen)
    c = 3 * torch.randn(n, 3, generator=gen)
    torch.manual_seed(seed)
    layer = nn.Linear(5, 3)
    eng = FunctionalEngine(nn.Sequential(layer), micro_batch=7) if functional else LinearEngine(layer)
    keep = torch.arange(n) != drop % n
    full = eng.clipped_sum(X, y, c, reg_scale=5.0, temperature=2.0, clip_norm=clip).grads
    rest = eng.clipped_sum(X[keep], y[keep], c[keep], reg_scale=5.0, temperature=2.0, clip_norm=clip).grads
    diff = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(full, rest)))
    assert float(diff) <= clip * (1 + 1e-5) + 1e-6


def test_row_softmax_matches_torch():
    z = torch.randn(100, 2)
    torch.testing.assert_close(row_softmax(z, 2.0), torch.softmax(2.0 * z, dim=1))
    z = torch.randn(10, 50)
    torch.testing.assert_close(row_softmax(z), torch.softmax(z, dim=1))
    assert row_softmax(torch.randn(7, 3)).is_contiguous()
    np.testing.assert_allclose(row_softmax(torch.zeros(3, 4)).numpy(), 0.25)
