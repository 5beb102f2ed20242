"""The one-run audit on the real training code: quiet on the correct mechanism, loud on the
two broken ones, and the broken switches unreachable from ``raco train``."""

from __future__ import annotations

import pytest
import torch

from raco_cli.audit.faults import histogram_mechanism
from raco_cli.audit.one_run import run_audit
from raco_cli.audit.result import AuditSpec
from raco_cli.cli.validate import compose_config, prevalidate
from raco_cli.errors import ConfigError, UnsupportedError
from raco_cli.methods.sgda import core
from raco_cli.run.prepare import prepare_run

BASE = ["dataset=synthetic", "eps=1", "method.batch_size=200", "tracking=none", "constraint.confidence=null"]


@pytest.fixture(scope="module")
def prepared():
    return lambda extra=(): prepare_run(compose_config([*BASE, *extra]))


@pytest.fixture(scope="module")
def results(prepared):
    return {mech: run_audit(prepared(), AuditSpec(canaries=300, seed=1, mechanism=mech))
            for mech in ("correct", "broken_no_noise", "broken_shared_class_noise")}


@pytest.mark.slow
def test_correct_mechanism_bound_stays_below_the_accounted_eps(results):
    r = results["correct"]
    assert r.eps_accounted <= 1.0
    assert r.eps_lower_bound <= r.eps_accounted and not r.violation
    assert r.conformance["ok"], r.conformance
    assert r.settings["histogram_releases"] == r.steps  # every step's histogram was scored


@pytest.mark.slow
@pytest.mark.parametrize("mech,score", [("broken_no_noise", "mass"), ("broken_shared_class_noise", "spread")])
def test_broken_mechanisms_are_caught(results, mech, score):
    r = results[mech]
    assert r.violation and r.eps_lower_bound > r.eps_accounted > 0.5
    best_by_score = {t["score"]: 0.0 for t in r.tests}
    for t in r.tests:
        best_by_score[t["score"]] = max(best_by_score[t["score"]], t["eps_lower_bound"])
    assert best_by_score[score] == r.eps_lower_bound
    assert not r.conformance["ok"]


@pytest.mark.slow
def test_shared_class_noise_has_the_right_marginal_but_full_correlation(results):
    c = results["broken_shared_class_noise"].conformance
    assert c["zero_fraction"] == 0 and c["mean_abs_over_scale"] == pytest.approx(1.0, abs=0.05)
    assert c["class_correlation"] > 0.99


def test_broken_switch_is_scoped_and_unreachable_from_train():
    original = core.laplace_noise
    with histogram_mechanism("broken_no_noise"):
        assert core.laplace_noise is not original
    assert core.laplace_noise is original
    with pytest.raises(ConfigError, match="Key 'audit' is not in the config"):
        prevalidate(["audit.mechanism=broken_no_noise"])
    with pytest.raises(ConfigError, match="Unknown key method.mechanism"):
        prevalidate(["+method.mechanism=broken_no_noise"])


def test_audit_rejects_methods_without_a_histogram(prepared):
    with pytest.raises(UnsupportedError, match="needs method=raco_dp and a rate constraint"):
        run_audit(prepared(["method=dp_sgd"]), AuditSpec(canaries=20))
    with pytest.raises(ConfigError, match=r"audit.mechanism must be one of correct, broken_no_noise, broken_shared_class_noise with"):
        AuditSpec(mechanism="off")


def test_audit_cells_leave_the_real_constraints_unchanged(synthetic):
    import numpy as np

    from raco_cli import constraints

    base = constraints.build("dp", n_classes=2, n_groups=2, gamma=0.05)
    aud = base.with_audit_cells(5, label=1)
    assert aud.Q == base.Q + 6 and aud.n_groups == 7
    assert aud.cells(np.array([1, 1, 0]), np.array([2, 6, 4])).tolist() == [base.Q, base.Q + 4, base.Q + 5]
    H = torch.rand(aud.Q, 2, dtype=torch.float64).numpy()
    np.testing.assert_allclose(aud.gamma_post(H, floor=1.0), base.gamma_post(H[: base.Q], floor=1.0))
    lam = np.ones(base.J)
    np.testing.assert_allclose(aud.cell_weights(H, lam, floor=1.0)[: base.Q], base.cell_weights(H[: base.Q], lam, floor=1.0))
    assert np.all(aud.cell_weights(H, lam, floor=1.0)[base.Q :] == 0)


def test_quick_audit_separates_correct_from_broken(prepared):
    """Default-run version of the slow tests above: 40 steps, m = 200."""
    correct = run_audit(prepared(["method.max_steps=40"]), AuditSpec(canaries=200, seed=2))
    broken = run_audit(prepared(["method.max_steps=40"]), AuditSpec(canaries=200, seed=2, mechanism="broken_no_noise"))
    assert correct.steps == broken.steps == 40
    assert correct.eps_lower_bound <= correct.eps_accounted < broken.eps_lower_bound
    assert broken.violation and not correct.violation
