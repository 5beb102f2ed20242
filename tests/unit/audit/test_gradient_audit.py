"""The gradient-path audit (audit.target=gradient): Dirac canaries on the real training code,
quiet on the correct mechanism, loud on the broken gradient releases, and the broken switches
scoped to the audit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raco_cli.audit import gradient
from raco_cli.audit.faults import gradient_mechanism
from raco_cli.audit.one_run import run_audit
from raco_cli.audit.result import AuditSpec
from raco_cli.cli.validate import compose_config, prevalidate
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods.gradients import LinearEngine
from raco_cli.methods.sgda import core
from raco_cli.run.prepare import prepare_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# C = 10: the "noise std sigma instead of sigma C" bug is a no-op at C = 1 and grows with C
BASE = ["dataset=synthetic", "eps=1", "method.batch_size=200", "method.clip_norm=10", "tracking=none", "constraint.confidence=null"]


@pytest.fixture(scope="module")
def prepared():
    return lambda extra=(): prepare_run(compose_config([*BASE, *extra]))


def test_a_dirac_canary_gradient_fills_its_own_column_only(synthetic):
    """Canary i's clipped per-sample gradient is C u_i in weight column d + i (up to the bias part,
    1/DIRAC as large) and no real row touches that column."""
    audit = AuditSpec(canaries=10, target="gradient")
    S = np.array([1, -1, 1, 1] + [-1] * 6)
    aug, Xc, d = gradient.augment(synthetic, audit, S)
    n = len(synthetic.y)
    assert aug.X.shape == (n + 3, d + 10) and np.all(aug.X[:n, d:] == 0)
    assert list(aug.splits["train"][-3:]) == [n, n + 1, n + 2] and list(aug.group[n:]) == [2, 4, 5]
    assert np.array_equal(aug.X[n:], Xc[[0, 2, 3]])
    layer = nn.Linear(d + 10, 2)
    nn.init.zeros_(layer.weight), nn.init.zeros_(layer.bias)  # p = (1/2, 1/2): |p - e_y| * DIRAC >> C
    X = torch.as_tensor(Xc[[0, 2]])
    res = LinearEngine(layer).clipped_sum(X[:1], torch.tensor([1]), reg_scale=0.0, temperature=1.0, clip_norm=2.0)
    weight, bias = res.grads
    assert torch.count_nonzero(weight[:, :d]) == 0 and torch.count_nonzero(weight[:, d + 1 :]) == 0
    assert float(weight[:, d].norm()) == pytest.approx(2.0, rel=1e-3)  # clipped to C, almost all in the column
    assert float(bias.norm()) == pytest.approx(2.0 / gradient.DIRAC, rel=1e-3)


def test_quick_gradient_audit_separates_correct_from_broken(prepared):
    """Default-run version: raco_dp, 40 steps, m = 200 canaries; bounds against the accounted eps."""
    results = {m: run_audit(prepared(["method.max_steps=40"]), AuditSpec(canaries=200, seed=2, target="gradient", mechanism=m))
               for m in ("correct", "broken_noise_sigma", "broken_clip_after_sum")}  # fmt: skip
    correct = results["correct"]
    assert correct.steps == 40 and correct.settings["gradient_releases"] == 40
    assert correct.eps_lower_bound <= correct.eps_accounted and not correct.violation and correct.conformance["ok"]
    assert correct.eps_accounted_released < correct.eps_accounted  # the histogram costs too
    for name in ("broken_noise_sigma", "broken_clip_after_sum"):
        r = results[name]
        assert r.violation and r.eps_lower_bound > r.eps_accounted, (name, r.eps_lower_bound, r.eps_accounted)
    assert not results["broken_noise_sigma"].conformance["ok"]  # measured noise ~ sigma / C
    assert results["broken_noise_sigma"].best["score"] == "llr_fit"


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["correct", "broken_noise_sigma", "broken_clip_after_sum"])
def test_dp_sgd_gradient_audit(prepared, mechanism):
    r = run_audit(prepared(["method=dp_sgd", "constraint=none"]), AuditSpec(canaries=500, seed=0, target="gradient", mechanism=mechanism))
    assert r.violation == (mechanism != "correct")
    assert (r.eps_lower_bound > r.eps_accounted) == (mechanism != "correct")


def test_gradient_faults_are_scoped_and_unreachable_from_train():
    noise, clipped_sum = core.gaussian_noise, LinearEngine.clipped_sum
    with gradient_mechanism("broken_noise_sigma", clip_norm=4.0, expected_batch=10.0):
        g = torch.Generator().manual_seed(0)
        assert float(core.gaussian_noise((20_000,), 8.0, g).std()) == pytest.approx(2.0, rel=0.05)  # std / C
    with gradient_mechanism("broken_clip_after_sum", clip_norm=1.0, expected_batch=10.0):
        assert LinearEngine.clipped_sum is not clipped_sum
    assert core.gaussian_noise is noise and LinearEngine.clipped_sum is clipped_sum
    with pytest.raises(ConfigError, match="Key 'audit' is not in the config"):
        prevalidate(["audit.mechanism=broken_noise_sigma"])


def test_gradient_audit_refusals(prepared):
    with pytest.raises(UnsupportedError, match="audits the noisy gradient sum of raco_dp and dp_sgd with model=logreg"):
        run_audit(prepared(["method=dp_fermi"]), AuditSpec(canaries=20, target="gradient"))
    with pytest.raises(UnsupportedError, match=r"\(got method=raco_dp, model=mlp\)"):
        run_audit(prepared(["model=mlp"]), AuditSpec(canaries=20, target="gradient"))
    with pytest.raises(ConfigError, match="audit.mechanism must be one of correct, broken_noise_sigma, broken_clip_after_sum"):
        AuditSpec(target="gradient", mechanism="broken_no_noise")
    with pytest.raises(ConfigError, match="audit.target must be one of histogram, gradient"):
        AuditSpec(target="weights")
