"""task=regression: squared-error per-sample gradients and clipping against autograd, every engine and
both model forms (with and without intercept), and the rows the training loop packs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raco_cli.data.group_mixture import load as mixture
from raco_cli.methods.gradients import FunctionalEngine, LinearEngine, engine_for, squared_error
from raco_cli.methods.training import Rows


def naive_clipped_sum(model, X, t, *, clip):
    """One autograd backward of ``(model(x_i) - t_i)^2`` per row, then clip to ``clip`` and sum."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    clipped = 0
    for i in range(len(t)):
        model.zero_grad()
        loss = ((model(X[i : i + 1])[0, 0] - t[i]) ** 2)
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        norm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
        factor = min(1.0, clip / norm) if clip is not None else 1.0
        clipped += int(clip is not None and norm > clip)
        for acc, g in zip(total, grads):
            acc += factor * g
    return total, clipped


def data(n=41, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    t = X @ torch.tensor([2.0, -1.0, 0.5])[:d] + 3.0 * torch.randn(n, generator=g)
    return X, t


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("clip", [None, 0.7, 4.0, 1e6])
def test_linear_engine_squared_loss_equals_autograd(bias, clip):
    X, t = data()
    torch.manual_seed(1)
    layer = nn.Linear(3, 1, bias=bias)
    res = LinearEngine(layer, loss="squared").clipped_sum(X, target=t, reg_scale=0.0, temperature=1.0, clip_norm=clip)
    ref, n_clipped = naive_clipped_sum(nn.Sequential(layer), X, t, clip=clip)
    assert len(res.grads) == (2 if bias else 1)
    for ours, theirs in zip(res.grads, ref):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert int(res.clipped) == n_clipped and (clip not in (None, 1e6) or n_clipped == 0)


@pytest.mark.parametrize("micro_batch", [1, 7, 1000])
def test_functional_engine_squared_loss_equals_autograd(micro_batch):
    X, t = data(n=19)
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    engine = FunctionalEngine(model, micro_batch=micro_batch, loss="squared")
    for clip in (0.5, None):  # clipped (vmap of grad) and plain (one backward) paths
        res = engine.clipped_sum(X, t, None, reg_scale=0.0, temperature=1.0, clip_norm=clip)
        ref, _ = naive_clipped_sum(model, X, t, clip=clip)
        for ours, theirs in zip(res.grads, ref):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_engines_agree_and_every_row_adds_at_most_C(bias):
    X, t = data(n=30)
    X = X * 20.0  # force clipping
    layer = nn.Linear(3, 1, bias=bias)
    closed = LinearEngine(layer, loss="squared")
    functional = FunctionalEngine(nn.Sequential(layer), micro_batch=8, loss="squared")
    a = closed.clipped_sum(X, target=t, reg_scale=0.0, temperature=1.0, clip_norm=0.3)
    b = functional.clipped_sum(X, t, None, reg_scale=0.0, temperature=1.0, clip_norm=0.3)
    for u, v in zip(a.grads, b.grads):
        torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-5)
    for i in range(len(t)):  # the sensitivity of the sum: removing a row moves it by <= C
        without = closed.clipped_sum(torch.cat([X[:i], X[i + 1 :]]), target=torch.cat([t[:i], t[i + 1 :]]), reg_scale=0.0,
                                     temperature=1.0, clip_norm=0.3)
        moved = torch.sqrt(sum(((g - h) ** 2).sum() for g, h in zip(a.grads, without.grads)))
        assert float(moved) <= 0.3 + 1e-5


@pytest.mark.parametrize("bias", [True, False])
def test_packed_rows_give_the_same_sums(bias):
    """The training loop's packed rows (target in the label slot, a bias-inclusive norm) give the
    closed form the same clipped sums as raw tensors; a row with a non-finite feature is dropped."""
    d = mixture(K=2, largest=60, ratio=3, slopes=[1.0, -2.0], P=3, eval_size=5, seed=3)
    X = np.array(d.X, copy=True)
    train = np.asarray(d.splits["train"])
    X[train[4], 1] = np.nan
    from dataclasses import replace

    d = replace(d, X=X)
    rows = Rows(d, train, d.group[train], torch.device("cpu"))
    batch = rows.batch(torch.arange(len(train)), labels=True)
    assert set(batch) == {"X", "xnorm", "target", "y"} and batch["target"].dtype == torch.float32
    torch.manual_seed(0)
    engine = engine_for(nn.Sequential(nn.Linear(3, 1, bias=bias)), micro_batch=64, loss="squared")
    packed = engine.clipped_sum(**batch, c=None, reg_scale=0.0, temperature=1.0, clip_norm=1.5)
    keep = np.delete(np.arange(len(train)), 4)
    Xr = torch.as_tensor(d.X[train][keep], dtype=torch.float32)
    tr = torch.as_tensor(d.target[train][keep], dtype=torch.float32)
    raw = engine.clipped_sum(Xr, target=tr, reg_scale=0.0, temperature=1.0, clip_norm=1.5)
    assert int(packed.nonfinite) == 1
    for u, v in zip(packed.grads, raw.grads):
        torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-5)


def test_squared_error_of_one_output():
    z = torch.tensor([[1.0], [-2.0], [0.5]])
    t = torch.tensor([0.0, 1.0, 0.5])
    assert squared_error(z, t).tolist() == [1.0, 9.0, 0.0]


def test_squared_loss_refuses_a_regularizer():
    layer = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="squared loss"):
        LinearEngine(layer, loss="squared").clipped_sum(torch.zeros(2, 2), target=torch.zeros(2), c=torch.zeros(2, 1),
                                                        reg_scale=1.0, temperature=1.0, clip_norm=1.0)
