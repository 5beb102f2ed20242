"""The result table's warnings: a near-constant released model and test groups too small to
measure a rate to within gamma (issue: no silent wrong answers on a user's own table)."""

from __future__ import annotations

from pathlib import Path

from raco_cli.cli.result_table import format_result, warning_lines


def _summary(rates: dict[str, float], sizes: dict[str, int], *, gamma: float = 0.05) -> dict:
    test = {"accuracy": 0.56, "dp_gap": abs(max(rates.values()) - min(rates.values())), "satisfied": True,
            "group_positive_rate": rates}
    return {"method": "raco_dp", "dataset": "people", "constraint": "dp", "gamma": gamma, "metrics": {"test": test},
            "group_sizes": {"test": sizes}, "privacy_scope": "model", "private": True, "satisfied": True,
            "eps_spent": 0.99, "eps_target": 1.0, "delta": 1e-5, "secure_rng": True, "steps": 100, "selected_step": 100}


def test_a_useful_model_on_large_groups_gets_no_warning():
    assert warning_lines(_summary({"a": 0.17, "b": 0.14}, {"a": 7632, "b": 3674})) == []


def test_a_model_that_predicts_one_class_everywhere_is_flagged():
    # the recidivism case: <= 5 % positives in every group looked like "accuracy 0.561, gap 0.01"
    lines = warning_lines(_summary({"a": 0.004, "b": 0.0, "c": 0.011}, {"a": 900, "b": 800, "c": 700}))
    assert len(lines) == 1 and "negative class" in lines[0] and "near-constant" in lines[0]
    lines = warning_lines(_summary({"a": 0.995, "b": 1.0}, {"a": 900, "b": 800}))
    assert len(lines) == 1 and "positive class" in lines[0]
    # one group that gets positives is enough: not constant
    assert warning_lines(_summary({"a": 0.0, "b": 0.2}, {"a": 900, "b": 800})) == []


def test_a_model_worse_than_the_constant_majority_class_is_flagged():
    """A DRO run on 1 200 rows of a user's table scored 0.43 against 0.67 for predicting the
    majority everywhere, and the table printed it like any result."""
    worse = {**_summary({"a": 0.4, "b": 0.5}, {"a": 900, "b": 800}), "label_counts": {"test": {"no": 1133, "yes": 567}}}
    worse["metrics"]["test"]["accuracy"] = 0.4333
    lines = warning_lines(worse)
    assert len(lines) == 1 and "0.4333 is below 0.6665" in lines[0] and "(no)" in lines[0] and len(lines[0]) < 400
    better = {**worse, "metrics": {"test": {**worse["metrics"]["test"], "accuracy": 0.70}}}
    assert warning_lines(better) == []
    # exactly the constant's accuracy is not below it; no counts (regression, older summaries): no line
    assert warning_lines({**better, "metrics": {"test": {**worse["metrics"]["test"], "accuracy": 1133 / 1700}}}) == []
    assert warning_lines({**worse, "label_counts": None}) == []


def test_small_test_groups_are_named_with_their_precision():
    # 1.96 * 0.5 / sqrt(n) > 0.05  <=>  n < 384: groups of 3 and 8 rows (the case) and 300
    lines = warning_lines(_summary({"a": 0.3, "b": 0.2, "c": 0.25, "d": 0.3}, {"a": 3, "b": 8, "c": 300, "d": 5000}))
    assert len(lines) == 1
    line = lines[0]
    assert "a (3 rows), b (8 rows), c (300 rows)" in line and "d (" not in line
    assert "+-0.57 at 95 %" in line  # 0.98 / sqrt(3)
    # the threshold follows gamma: at gamma = 0.2 only groups below 25 rows
    assert "c (300 rows)" not in warning_lines(_summary({"a": 0.3, "c": 0.25}, {"a": 3, "c": 300}, gamma=0.2))[0]


def test_the_warnings_are_printed_in_the_result_table(tmp_path: Path):
    text = format_result(_summary({"a": 0.0, "b": 0.0}, {"a": 10, "b": 4000}), tmp_path)
    warnings = [line for line in text.splitlines() if line.strip().startswith("warning")]
    assert len(warnings) == 2 and all(len(w) < 400 for w in warnings)


def test_a_confidence_auto_that_the_data_cannot_support_is_said_in_the_table(tmp_path: Path):
    """constraint.confidence=auto that fell back to gamma: the table says no confidence is claimed
    (before, only a log warning said so and the table had no confidence line at all)."""
    summary = _summary({"a": 0.3, "b": 0.31}, {"a": 900, "b": 800})
    note = "auto (0.9) not met: dp[group=0,class=0] needs a margin of 0.575 > gamma 0.05; trained against gamma itself"
    text = format_result({**summary, "confidence": None, "margins": None, "confidence_note": note}, tmp_path)
    assert f"  confidence           none   ({note})" in text.splitlines()
    assert "  confidence " not in format_result(summary, tmp_path)  # confidence=null: no line


def test_a_confidence_is_printed_only_beside_a_certificate_that_holds(tmp_path: Path):
    """Issue 61: the table printed "confidence 0.9 ... w.p. >= 0.9" whenever margins existed. It
    now prints the probability only when the released model's certificate holds; otherwise the
    note with the gamma the certificate supports, and never the probability."""
    note = "the certificate on validation does not support 0.9 at gamma 0.05 (it gives 0.62); it supports 0.9 at gamma >= 0.061"
    failed = {"holds": False, "confidence": 0.9, "achieved": 0.62, "slack": 0.011, "candidates": 1, "count_sd": 21.0}
    summary = {**_summary({"a": 0.3, "b": 0.31}, {"a": 900, "b": 800}), "margins": {"dp": 0.0243}, "confidence": None,
               "confidence_note": note, "certificate": failed}
    text = format_result(summary, tmp_path)
    assert f"  confidence           none   ({note})" in text.splitlines()
    assert "w.p. >=" not in text
    # a confidence in the summary without a certificate that holds (an older record, a bug): not printed
    assert "w.p. >=" not in format_result({**summary, "confidence": 0.9, "confidence_note": None}, tmp_path)
    assert "w.p. >=" not in format_result({**summary, "confidence": 0.9, "certificate": None}, tmp_path)
    certified = format_result({**summary, "confidence": 0.9, "confidence_note": None, "certificate": {**failed, "holds": True}}, tmp_path)
    assert ("  confidence           0.9   (certified on noisy validation counts: meets gamma on new data of the test split's size "
            "w.p. >= 0.9)") in certified.splitlines()


def test_a_near_constant_model_is_said_before_any_number_with_the_majority_rate(tmp_path: Path):
    """Issue 61: a near-constant model must not be presented as a result; the table's first line
    after the title says so, with the constant model's accuracy a user compares to."""
    summary = {**_summary({"a": 0.004, "b": 0.0}, {"a": 9000, "b": 8000}), "label_counts": {"test": {"0": 760, "1": 240}}}
    lines = format_result(summary, tmp_path).splitlines()
    assert "near-constant model" in lines[1] and "predicting class 0 everywhere scores 0.7600" in lines[1]
    assert "worse than a constant" in lines[2]  # accuracy 0.56 < 0.76: the second headline warning
    assert lines[3] == "  test accuracy        0.5600   (predicting the majority class 0 everywhere: 0.7600)"
    assert sum("near-constant" in line for line in lines) == 1  # said once, at the top
    useful = {**_summary({"a": 0.3, "b": 0.28}, {"a": 9000, "b": 8000}), "label_counts": {"test": {"0": 500, "1": 500}}}
    assert format_result(useful, tmp_path).splitlines()[1].startswith("  test accuracy ")
