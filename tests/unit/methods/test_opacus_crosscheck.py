"""dp_sgd against Opacus: same clipping semantics, same noise scale, same epsilon.

Opacus' DPOptimizer clips each per-sample gradient to ``max_grad_norm`` (flat clipping over
all parameters), sums, adds N(0, (noise_multiplier * max_grad_norm)^2) and divides by
``expected_batch_size``; our step is the same with C, sigma and q|D|.
"""

from __future__ import annotations

import copy
import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from specs import paper_spec
from torch import nn

from raco_cli import models
from raco_cli.methods import training
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.gradients import engine_for
from raco_cli.privacy import accountant

opacus = pytest.importorskip("opacus")
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook:UserWarning")


def _opacus_step_grad(model, X, y, *, clip, sigma, expected_batch, seed=0):
    """One DPOptimizer pre-step on (X, y): the privatised averaged gradient of each parameter."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gsm = GradSampleModule(copy.deepcopy(model))
    opt = DPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=1.0),
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=expected_batch,
        generator=torch.Generator().manual_seed(seed),
    )
    opt.zero_grad()
    loss = nn.functional.cross_entropy(gsm(X), y)  # loss_reduction="mean": Opacus rescales grad samples by the batch size
    loss.backward()
    opt.pre_step()
    return [p.grad.detach().clone() for p in gsm.parameters()]


@pytest.mark.parametrize("clip", [0.1, 1.0, 100.0])  # clipping binds for most, some, no rows
@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
def test_noiseless_clipped_gradient_equals_opacus(synthetic, clip, model_name):
    torch.manual_seed(0)
    model = models.build(model_name, input_shape=synthetic.input_shape, n_classes=2, options={"hidden": [8]} if model_name == "mlp" else {})
    training.initialize(model, Seeds.from_seed(3).init)
    idx = np.asarray(synthetic.splits["train"])[:300]
    X = torch.as_tensor(synthetic.rows(idx), dtype=torch.float32)
    y = torch.as_tensor(synthetic.y[idx])
    expected_batch = 250.0  # q|D|, not the realised batch size
    ours = engine_for(model, micro_batch=128).clipped_sum(X, y, None, reg_scale=0.0, temperature=1.0, clip_norm=clip)
    theirs = _opacus_step_grad(model, X, y, clip=clip, sigma=0.0, expected_batch=expected_batch)
    for g_ours, g_theirs in zip(ours.grads, theirs):
        torch.testing.assert_close(g_ours / expected_batch, g_theirs, rtol=1e-4, atol=1e-6)


def test_noise_scale_equals_opacus(synthetic, request, engine):
    """The noise of one step on the averaged gradient: std sigma*C/B in both."""
    from raco_cli import constraints
    from raco_cli.methods.sgda import dp_sgd

    sigma, clip, B = 2.0, 0.5, 100
    model = nn.Sequential(nn.Flatten(), nn.Linear(400, 10))
    X = torch.zeros(5, 400)  # zero inputs, zero weights, bias gradients only: weight grads are pure noise
    nn.init.zeros_(model[1].weight)
    y = torch.zeros(5, dtype=torch.long)
    theirs = _opacus_step_grad(model, X, y, clip=clip, sigma=sigma, expected_batch=B)[0]
    expected = sigma * clip / B
    assert theirs.std().item() == pytest.approx(expected, rel=0.05)

    request.getfixturevalue("zero_gradient_sums")  # our step with zero data gradients: pure noise (after Opacus' step above)
    spec = paper_spec(name="dp_sgd", batch_size=B, noise_multiplier=sigma, clip_norm=clip, lr=1.0, eval_every=10**6, selection="last")
    cons = constraints.build("none", n_classes=2, n_groups=synthetic.n_groups, gamma=0.0)
    drift = []
    for seed in range(40):
        m = models.build("logreg", input_shape=synthetic.input_shape, n_classes=2)
        training.initialize(m, Seeds.from_seed(seed).init)
        before = torch.cat([p.detach().flatten() for p in m.parameters()]).clone()
        res = dp_sgd.fit(synthetic, m, cons, spec, steps=1, seeds=Seeds.from_seed(seed), device=torch.device("cpu"), reporter=NullReporter())
        drift.append((torch.cat([v.flatten() for v in res.state_dict.values()]) - before).numpy())
    ours = np.concatenate(drift).std()
    assert ours == pytest.approx(expected, rel=0.15)
    assert ours == pytest.approx(theirs.std().item(), rel=0.2)


@pytest.mark.parametrize(
    ("q", "sigma", "steps"),
    [(0.01, 1.0, 1000), (1024 / 28_800, 3.0, 409), (0.05, 2.0, 300), (0.004, 0.8, 2000)],
)
def test_epsilon_equals_opacus_prv(q, sigma, steps):
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    # Opacus returns the upper end of an interval of width eps_error (default 0.01 absolute)
    theirs = prv.get_epsilon(delta=1e-5, eps_error=1e-3)
    ours = accountant.epsilon(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps), 1e-5)
    assert math.isfinite(ours) and ours == pytest.approx(theirs, rel=0.01)
    assert ours <= theirs + 1e-3  # both are upper bounds; the PLD one is the tighter here
