"""Per-sample gradients of a conv net (tiny ResNet16): micro-batched engine vs the definition."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from raco_cli import models
from raco_cli.methods.gradients import FunctionalEngine, engine_for, resolve_precision


def tiny_resnet(seed=0):
    torch.manual_seed(seed)
    return models.build("resnet16", input_shape=(3, 8, 8), n_classes=2, options={"width": 0.125, "groups": 4, "blocks": [1, 1, 1, 1]})


def tiny_batch(n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 2, (n,), generator=g), torch.randn(n, 2, generator=g)


def direct_per_sample(model, X, y, c, *, reg_scale, tau):
    """One autograd pass per row of the whole per-sample objective (loss + reg_scale * c . softmax)."""
    out = []
    for i in range(len(y)):
        model.zero_grad()
        z = model(X[i : i + 1])
        loss = nn.functional.cross_entropy(z, y[i : i + 1]) + reg_scale * (c[i] * torch.softmax(tau * z, dim=1)[0]).sum()
        loss.backward()
        out.append([p.grad.detach().clone() for p in model.parameters()])
    return out


def clip_and_sum(per_sample, clip):
    total = [torch.zeros_like(g) for g in per_sample[0]]
    norms = []
    for grads in per_sample:
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
        norms.append(norm)
        factor = min(1.0, clip / norm) if clip is not None else 1.0
        for t, g in zip(total, grads):
            t += factor * g
    return total, norms


@functools.cache
def reference(clip):
    model = tiny_resnet().double()
    X, y, c = (t.double() if t.is_floating_point() else t for t in tiny_batch())
    return model, X, y, c, clip_and_sum(direct_per_sample(model, X, y, c, reg_scale=5.0, tau=2.0), clip)


@pytest.mark.parametrize("micro_batch", [1, 3, 7, 64])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_micro_batched_conv_per_sample_gradients_equal_direct(micro_batch, clip):
    """float64 so that the comparison is tight: any mixing of rows (a batch statistic, a
    wrong chunk boundary) would show far above 1e-9."""
    model, X, y, c, (ref, norms) = reference(clip)
    res = FunctionalEngine(model, micro_batch=micro_batch).clipped_sum(X, y, c, reg_scale=5.0, temperature=2.0, clip_norm=clip)
    for a, b in zip(res.grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    if clip is None:  # non-private: one plain backward of the summed objective, no per-sample norms
        assert int(res.clipped) == 0 and torch.isnan(res.norm_sum)
    else:
        assert float(res.norm_sum) == pytest.approx(sum(norms), rel=1e-9)
        assert int(res.clipped) == sum(n > clip for n in norms)


def test_bf16_autocast_keeps_the_clipping_bound_exact():
    """Reduced precision changes the gradient, never the per-row bound: each row's clipped
    contribution has norm <= C (fp32 norms and factors), and points where the fp32 one does."""
    torch.manual_seed(0)
    model = models.build("resnet16", input_shape=(3, 32, 32), n_classes=2, options={"width": 0.25})
    X, y, c = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 1, 0]), torch.randn(4, 2)
    amp = FunctionalEngine(model, micro_batch=4, amp_dtype=torch.bfloat16)
    exact = FunctionalEngine(model, micro_batch=4)
    C = 0.05
    for i in range(len(y)):
        row = (X[i : i + 1], y[i : i + 1], c[i : i + 1])
        res = amp.clipped_sum(*row, reg_scale=5.0, temperature=1.0, clip_norm=C)
        assert all(g.dtype == torch.float32 for g in res.grads) and int(res.nonfinite) == 0
        assert float(torch.sqrt(sum((g.double() ** 2).sum() for g in res.grads))) <= C * (1 + 1e-6)
        a = torch.cat([g.flatten() for g in res.grads])
        b = torch.cat([g.flatten() for g in exact.clipped_sum(*row, reg_scale=5.0, temperature=1.0, clip_norm=C).grads])
        assert float(nn.functional.cosine_similarity(a, b, dim=0)) > 0.9


def test_engine_choice_and_precision():
    assert type(engine_for(tiny_resnet(), micro_batch=8)).__name__ == "FunctionalEngine"
    logreg = models.build("logreg", input_shape=(3, 8, 8), n_classes=2)
    assert type(engine_for(logreg, micro_batch=8, amp_dtype=torch.bfloat16)).__name__ == "LinearEngine"
    assert resolve_precision("auto", torch.device("cpu")) is None
    assert resolve_precision("fp32", torch.device("cuda")) is None


def test_logits_are_fp32_and_chunked_evaluation_matches():
    model = tiny_resnet()
    X, _, _ = tiny_batch(n=5)
    eng = FunctionalEngine(model, micro_batch=2, amp_dtype=torch.bfloat16)
    assert eng.logits(X).dtype == torch.float32
    assert eng.eval_chunk == 2
