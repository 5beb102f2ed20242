"""Per-record DRO gradients against a plain autograd loop over records (both engines)."""

from __future__ import annotations

import pytest
import torch

from raco_cli import models
from raco_cli.methods.dro.engine import (
    FunctionalRecordEngine,
    LinearRecordEngine,
    clip_rows,
    record_engine,
)


def reference(model, X, y, terms, clip):
    """sum_i clip(sum_k w_ki grad l_i(theta_k), C) by one autograd call per record and point."""
    params = [p for p in model.parameters()]
    current = [p.detach().clone() for p in params]
    total = [torch.zeros_like(p) for p in params]
    for i in range(len(y)):
        v = [torch.zeros_like(p) for p in params]
        for point, w in terms:
            with torch.no_grad():
                for p, value in zip(params, point if point is not None else current):
                    p.copy_(value)
            loss = torch.nn.functional.cross_entropy(model(X[i : i + 1]), y[i : i + 1])
            for acc, g in zip(v, torch.autograd.grad(loss, params)):
                acc += w[i] * g
        norm = torch.sqrt(sum((g * g).sum() for g in v))
        f = 1.0 if clip is None else min(1.0, clip / (float(norm) + 1e-12))
        for acc, g in zip(total, v):
            acc += f * g
    with torch.no_grad():
        for p, value in zip(params, current):
            p.copy_(value)
    return total


@pytest.mark.parametrize("name", ["logreg", "mlp"])
@pytest.mark.parametrize("clip", [None, 0.3])
def test_clipped_sums_match_autograd(name, clip):
    torch.manual_seed(0)
    model = models.build(name, input_shape=(5,), n_classes=3, options={"hidden": [7]} if name == "mlp" else {})
    engine = record_engine(model, micro_batch=4)
    assert isinstance(engine, LinearRecordEngine if name == "logreg" else FunctionalRecordEngine)
    X, y = torch.randn(11, 5), torch.randint(0, 3, (11,))
    previous = [p.detach() + 0.3 * torch.randn_like(p) for p in engine.params]
    w1, w2 = torch.rand(11) * 3, torch.rand(11)
    for terms in ([(None, w1)], [(None, w1), (previous, -w2)]):
        got = engine.clipped_sum(X, y, terms, clip)
        want = reference(model, X, y, terms, clip)
        for g, r in zip(got.grads, want):
            torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(engine.losses(X, y, previous), _losses_at(model, X, y, previous))


def _losses_at(model, X, y, point):
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, v in zip(model.parameters(), point):
            p.copy_(v)
        out = torch.nn.functional.cross_entropy(model(X), y, reduction="none")
        for p, v in zip(model.parameters(), saved):
            p.copy_(v)
    return out


def test_one_record_moves_the_sum_by_at_most_C():
    """The sensitivity the noise is calibrated to: a record with a huge weighted difference
    moves sum_i clip(v_i) by at most C (clipping the batch mean would move it by up to 2C x B)."""
    torch.manual_seed(1)
    model = models.build("mlp", input_shape=(4,), n_classes=2, options={"hidden": [6]})
    engine = record_engine(model, micro_batch=8)
    X, y = torch.randn(30, 4), torch.randint(0, 2, (30,))
    prev = [p.detach() - 2.0 for p in engine.params]
    w = torch.rand(30) * 50
    C = 0.5
    full = engine.clipped_sum(X, y, [(None, w), (prev, -w)], C).grads
    less = engine.clipped_sum(X[1:], y[1:], [(None, w[1:]), (prev, -w[1:])], C).grads
    moved = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(full, less)))
    assert float(moved) <= C * (1 + 1e-5)
    rows = torch.randn(30, 2) * 100
    assert float((clip_rows(rows, C)[0] - clip_rows(rows[1:], C)[0]).norm()) <= C * (1 + 1e-6)


def test_non_finite_records_are_dropped():
    model = models.build("logreg", input_shape=(3,), n_classes=2)
    engine = record_engine(model, micro_batch=8)
    X, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    w = torch.tensor([1.0, float("inf"), 1.0, float("nan")])
    res = engine.clipped_sum(X, y, [(None, w)], 1.0)
    assert int(res.nonfinite) == 2 and all(torch.isfinite(g).all() for g in res.grads)
    assert torch.isfinite(clip_rows(torch.tensor([[1.0], [float("nan")]]), 1.0)[0]).all()


@pytest.mark.parametrize("name", ["logreg", "mlp"])
def test_a_row_of_huge_dro_weight_is_clipped_not_dropped(name):
    """A worst-case weight of e^60 (divergences.MAX_EXPONENT): the row's squared float32 norm
    overflows, and the row must still count, clipped to C, like its unweighted direction."""
    torch.manual_seed(0)
    model = models.build(name, input_shape=(5,), n_classes=2, options={"hidden": [7]} if name == "mlp" else {})
    engine = record_engine(model, micro_batch=4)
    X, y = torch.randn(6, 5), torch.randint(0, 2, (6,))
    huge = torch.ones(6)
    huge[2] = float(torch.exp(torch.tensor(60.0)))
    got = engine.clipped_sum(X, y, [(None, huge)], 0.5)
    want = reference(model, X, y, [(None, torch.where(huge > 1, torch.tensor(1e6), huge))], 0.5)  # same direction, clipped
    assert int(got.nonfinite) == 0
    for g, r in zip(got.grads, want):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)
