"""Custom rate constraints written in YAML: parsing, partition derivation, exact messages."""

from __future__ import annotations

import numpy as np
import pytest

from raco_cli.constraints import build, build_parts, part_spec
from raco_cli.constraints import custom as custom_mod
from raco_cli.errors import ConfigError

CLASSES = ("no", "yes")
GROUPS = ("A", "B", "C")

FOUR_FIFTHS = [
    {
        "name": "four_fifths",
        "gamma": 0.0,
        "terms": [
            {"alpha": 0.8, "predicted": "yes", "group": "B"},
            {"alpha": -1.0, "predicted": "yes", "group": "A"},
        ],
    }
]


def _build(constraints, gamma=0.0):
    return build("custom", n_classes=2, n_groups=3, gamma=gamma, options={"constraints": constraints},
                 class_names=CLASSES, group_names=GROUPS)  # fmt: skip


def test_four_fifths_rule_values_and_partition():
    """0.8 * P_1(D[Z=B]) - P_1(D[Z=A]) <= 0; the partition is {A}, {B}, {C} (C in no subset)."""
    cs = _build(FOUR_FIFTHS)
    assert cs.J == 1 and cs.names == ("four_fifths",)
    assert cs.Q == 3
    rng = np.random.default_rng(0)
    n = 2000
    y, group = rng.integers(0, 2, n), rng.integers(0, 3, n)
    probs = rng.dirichlet(np.ones(2), n)
    H = cs.histogram(probs, cs.cells(y, group))
    direct = 0.8 * probs[group == 1, 1].mean() - probs[group == 0, 1].mean()
    np.testing.assert_allclose(cs.gamma_post(H, floor=None), [direct], atol=1e-12)


def test_label_and_group_selections_give_the_smallest_partition():
    """FNR of group A vs. the other groups, written by hand: partition by (label=1, group A or not)."""
    spec = [{"terms": [{"predicted": 0, "label": "yes", "group": "A"},
                       {"alpha": -1, "predicted": 0, "label": 1, "group_not": "A"}]}]  # fmt: skip
    cs = _build(spec, gamma=0.05)
    assert cs.names == ("custom[0]",)
    assert cs.gamma.tolist() == [0.05]  # default gamma
    assert cs.Q == 3  # {y=1, A}, {y=1, B or C}, {y=0}
    assert cs.cell_of[1, 1] == cs.cell_of[1, 2] != cs.cell_of[1, 0]
    assert cs.cell_of[0, 0] == cs.cell_of[0, 1] == cs.cell_of[0, 2]


def test_negative_gamma_is_a_lower_bound():
    cs = _build([{"gamma": -0.8, "terms": [{"alpha": -1, "predicted": 1, "label": 1}]}])
    assert cs.gamma.tolist() == [-0.8]


def test_custom_matches_the_builtin_family():
    """dp written by hand equals constraint=dp."""
    spec = []
    for z in GROUPS:
        for k in CLASSES:
            spec.append({"name": f"{z}{k}", "terms": [{"predicted": k, "group": z}, {"alpha": -1, "predicted": k, "group_not": z}]})
    cs, dp = _build(spec, gamma=0.1), build("dp", n_classes=2, n_groups=3, gamma=0.1)
    rng = np.random.default_rng(1)
    y, group, probs = rng.integers(0, 2, 500), rng.integers(0, 3, 500), rng.dirichlet(np.ones(2), 500)
    assert cs.Q == dp.Q
    np.testing.assert_allclose(
        cs.gamma_post(cs.histogram(probs, cs.cells(y, group)), floor=None),
        dp.gamma_post(dp.histogram(probs, dp.cells(y, group)), floor=None),
    )


def test_custom_in_a_combination():
    parts = [part_spec("fnr", {"gamma": 0.2, "positive_class": 1}, key="c"),
             part_spec("custom", {"gamma": 0.0, "constraints": FOUR_FIFTHS}, key="c")]  # fmt: skip
    cs = build_parts(parts, n_classes=2, n_groups=3, class_names=CLASSES, group_names=GROUPS)
    assert cs.J == 2 and cs.families == ("fnr", "custom")
    assert cs.Q == 6  # label x {A, B, C}


KEY = "constraint.constraints"


@pytest.mark.parametrize(
    "spec,message",
    [
        ([], f"{KEY} must be a non-empty list of rate constraints (got {KEY}=[]); see conf/constraint/custom.yaml."),
        ([{"terms": []}], f"{KEY}[0].terms must be a non-empty list of terms {{alpha, predicted, label, group}} (got []); "
                          "see conf/constraint/custom.yaml."),
        ([{"terms": [{"predicted": 1, "group": "D"}]}],
         f"Unknown group 'D' in {KEY}[0].terms[0].group. Available: A, B, C (or indices 0..2)."),
        ([{"terms": [{"predicted": 1, "group": 3}]}],
         f"{KEY}[0].terms[0].group=3 is out of range: the data has group indices 0..2 (A, B, C (or indices 0..2))."),
        ([{"terms": [{"predicted": "maybe"}]}],
         f"Unknown class 'maybe' in {KEY}[0].terms[0].predicted. Available: no, yes (or indices 0..1)."),
        ([{"terms": [{"predicted": 1, "label": 5}]}],
         f"{KEY}[0].terms[0].label=5 is out of range: the data has class indices 0..1 (no, yes (or indices 0..1))."),
        ([{"terms": [{"predicted": 1, "group": "A", "group_not": "A"}]}],
         f"{KEY}[0].terms[0] selects no rows: every group is excluded by {KEY}[0].terms[0].group_not; "
         "a term's rows are (label in [0, 1]) x (group in [])."),
        ([{"terms": [{"predicted": 1, "group": []}]}],
         f"{KEY}[0].terms[0].group is an empty list, so the term selects no rows; omit the key to select every value."),
        ([{"terms": [{"alpha": 0, "predicted": 1}]}],
         f"{KEY}[0].terms[0].alpha must be a finite non-zero number (got {KEY}[0].terms[0].alpha=0); it weighs the rate of this term."),
        ([{"terms": [{"alpha": "big", "predicted": 1}]}],
         f"{KEY}[0].terms[0].alpha must be a finite non-zero number (got {KEY}[0].terms[0].alpha='big'); it weighs the rate of this term."),
        ([{"terms": [{"alpha": float("nan"), "predicted": 1}]}],
         f"{KEY}[0].terms[0].alpha must be a finite non-zero number (got {KEY}[0].terms[0].alpha=nan); it weighs the rate of this term."),
        ([{"terms": [{"alpha": 1}]}],
         f"{KEY}[0].terms[0].predicted is missing; name the predicted class k whose rate P_k the term takes."),
        ([{"terms": [{"predicted": 1, "grup": "A"}]}],
         f"Unknown key {KEY}[0].terms[0].grup. Allowed: alpha, group, group_not, label, label_not, predicted."),
        ([{"name": "x", "terms": [{"predicted": 1}]}, {"name": "x", "terms": [{"predicted": 0}]}],
         f"{KEY}[1].name 'x' is used twice; constraint names must be unique."),
        ([{"gamma": "low", "terms": [{"predicted": 1}]}],
         f"{KEY}[0].gamma must be a finite number (got 'low'); it is the right-hand side of the constraint."),
    ],
)
def test_exact_messages(spec, message):
    with pytest.raises(ConfigError) as info:
        _build(spec)
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_structure_is_checked_without_the_data():
    """Names are resolved only with the data; structure errors come before (at config time)."""
    custom_mod.check([{"terms": [{"predicted": "whatever", "group": "Z"}]}], key=KEY)  # names: later
    with pytest.raises(ConfigError, match=r"alpha must be a finite non-zero number"):
        custom_mod.check([{"terms": [{"alpha": None, "predicted": 1}]}], key=KEY)
