"""Per-family evaluation (summary.json ``metrics.<split>.constraints.<family>``), cross-checked
against fairlearn's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from fairlearn.metrics import (
    demographic_parity_difference,
    equal_opportunity_difference,
    equalized_odds_difference,
    false_negative_rate,
    false_positive_rate,
)

from raco_cli.constraints import build, build_parts, part_spec
from raco_cli.metrics.evaluate import evaluate, softmax


def _data(seed=0, n=3000, n_groups=2):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    group = rng.integers(0, n_groups, n)
    logits = np.stack([np.zeros(n), rng.normal(size=n) + 1.2 * y - 0.4 * group - 0.5], axis=1)
    return logits, y, group, logits.argmax(1)


def _eval(name, options=None, seed=0, gamma=0.05):
    logits, y, group, pred = _data(seed)
    cs = build(name, n_classes=2, n_groups=2, gamma=gamma, options=options)
    m = evaluate(logits, y, group, constraints=cs, temperature=2.0, group_names=("a", "b"))
    return m, y, group, pred, logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_family_values_equal_fairlearn(seed):
    m, y, group, pred, _ = _eval("eo", seed=seed)
    eo = m["constraints"]["eo"]
    assert eo["max_hard"] == pytest.approx(equalized_odds_difference(y, pred, sensitive_features=group))
    assert eo["standard"]["eo_gap"] == pytest.approx(eo["max_hard"])
    m, *_ = _eval("eop", seed=seed)
    assert m["constraints"]["eop"]["max_hard"] == pytest.approx(equal_opportunity_difference(y, pred, sensitive_features=group))
    m, *_ = _eval("dp", seed=seed)
    assert m["constraints"]["dp"]["max_hard"] == pytest.approx(demographic_parity_difference(y, pred, sensitive_features=group))
    m, *_ = _eval("fnr", {"positive_class": 1}, seed=seed)
    assert m["constraints"]["fnr"]["values_hard"] == [pytest.approx(false_negative_rate(y, pred, pos_label=1))]
    m, *_ = _eval("fnr", seed=seed)  # the paper's eq. 17: [FNR, FPR] for binary tasks
    assert m["constraints"]["fnr"]["values_hard"] == [
        pytest.approx(false_negative_rate(y, pred, pos_label=1)), pytest.approx(false_positive_rate(y, pred, pos_label=1))
    ]
    assert m["constraints"]["fnr"]["standard"] == {"fnr": pytest.approx(false_negative_rate(y, pred, pos_label=1))}
    m, *_ = _eval("fpr", seed=seed)
    assert m["constraints"]["fpr"]["values_hard"] == [pytest.approx(false_positive_rate(y, pred, pos_label=1))]


def test_soft_values_and_violations():
    m, y, group, _, logits = _eval("fnr", {"positive_class": 1}, gamma=0.1)
    fm = m["constraints"]["fnr"]
    p = softmax(logits, 2.0)
    assert fm["values_soft"] == [pytest.approx(p[y == 1, 0].mean())]
    assert fm["max_violation_hard"] == pytest.approx(fm["values_hard"][0] - 0.1)
    assert fm["max_violation_soft"] == pytest.approx(fm["values_soft"][0] - 0.1)
    assert fm["satisfied"] == (fm["values_hard"][0] <= 0.1)
    assert fm["names"] == ["fnr[positive=1]"] and fm["gamma"] == [0.1]


def test_combination_reports_every_family_with_its_own_gamma():
    logits, y, group, pred = _data()
    parts = [part_spec("dp", {"gamma": 0.3}, key="c"), part_spec("fnr", {"gamma": 0.01, "positive_class": 1}, key="c")]
    cs = build_parts(parts, n_classes=2, n_groups=2)
    m = evaluate(logits, y, group, constraints=cs, temperature=1.0, group_names=("a", "b"))
    assert list(m["constraints"]) == ["dp", "fnr"]
    dp, fnr = m["constraints"]["dp"], m["constraints"]["fnr"]
    assert len(dp["values_hard"]) == 4 and len(fnr["values_hard"]) == 1
    assert m["constraint_values_hard"] == pytest.approx(dp["values_hard"] + fnr["values_hard"])
    assert m["violation_hard"] == pytest.approx(max(dp["max_violation_hard"], fnr["max_violation_hard"]))
    assert m["satisfied"] == (dp["satisfied"] and fnr["satisfied"])
    assert fnr["max_violation_hard"] == pytest.approx(false_negative_rate(y, pred, pos_label=1) - 0.01)


def test_unconstrained_run_has_no_families():
    logits, y, group, _ = _data()
    m = evaluate(logits, y, group, constraints=build("none", n_classes=2, n_groups=2, gamma=0.0), temperature=1.0,
                 group_names=("a", "b"))  # fmt: skip
    assert m["constraints"] == {}
