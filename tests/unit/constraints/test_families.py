"""Every constraint family: Gamma_post on the exact histogram equals the rates computed
directly from predictions, J matches the paper's Table 1, the derived partition is the
smallest one (paper Remark 1), and combinations use the common refinement."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from raco_cli.constraints import ConstraintSet, build, build_parts, part_spec
from raco_cli.errors import ConfigError

SHAPES = [(2, 2), (2, 3), (3, 2), (3, 4)]  # (n_classes, n_groups)


def _rate(probs, mask, k):
    return probs[mask, k].mean()


# --- direct (row-level) definitions of each family, written independently of the engine -------


def direct_dp(probs, y, group, K, Z, **_):
    return [_rate(probs, group == z, k) - _rate(probs, group != z, k) for z in range(Z) for k in range(K)]


def direct_eo(probs, y, group, K, Z, **_):
    return [
        _rate(probs, (y == c) & (group == z), k) - _rate(probs, (y == c) & (group != z), k)
        for c in range(K) for z in range(Z) for k in range(K)
    ]  # fmt: skip


def direct_fnr(probs, y, group, K, Z, positive_class=None):
    if positive_class is None:  # paper eq. 17
        return [_rate(probs, y != k, k) for k in range(K)]
    return [1.0 - _rate(probs, y == positive_class, positive_class)]


def direct_fpr(probs, y, group, K, Z, positive_class=1):
    classes = range(K) if positive_class is None else [positive_class]
    return [_rate(probs, y != c, c) for c in classes]


def direct_eop(probs, y, group, K, Z, positive_class=1):
    out = []
    for z in range(Z):
        d = _rate(probs, (y == positive_class) & (group == z), positive_class) - _rate(
            probs, (y == positive_class) & (group != z), positive_class
        )
        out += [d, -d]
    return out


DIRECT = {"dp": direct_dp, "eo": direct_eo, "fnr": direct_fnr, "fpr": direct_fpr, "eop": direct_eop}
CASES = [("dp", {}), ("eo", {}), ("fnr", {}), ("fnr", {"positive_class": 1}), ("fpr", {}),
         ("fpr", {"positive_class": None}), ("eop", {})]  # fmt: skip


def _rows(K, Z, n=3000, seed=0):
    rng = np.random.default_rng(seed)
    y, group = rng.integers(0, K, n), rng.integers(0, Z, n)
    probs = rng.dirichlet(np.ones(K), n)
    return y, group, probs


@pytest.mark.parametrize("name,options", CASES)
@pytest.mark.parametrize("K,Z", SHAPES)
def test_gamma_post_on_exact_histogram_equals_direct_rates(name, options, K, Z):
    y, group, probs = _rows(K, Z)
    cs = build(name, n_classes=K, n_groups=Z, gamma=0.0, options=options)
    for p in (probs, np.eye(K)[probs.argmax(1)]):  # soft and hard rates
        H = cs.histogram(p, cs.cells(y, group))
        np.testing.assert_allclose(cs.gamma_post(H, floor=None), DIRECT[name](p, y, group, K, Z, **options), atol=1e-12)


@pytest.mark.parametrize("K,Z", SHAPES)
def test_counts_match_table_1(K, Z):
    """J: DP |Z||Y|, EO |Y|^2|Z|, FNR |Y| (paper Table 1); Q: group, (label, group), label."""
    expect = {"dp": (Z * K, Z), "eo": (K * K * Z, K * Z), "fnr": (K, K)}
    for name, (J, Q) in expect.items():
        cs = build(name, n_classes=K, n_groups=Z, gamma=0.1)
        assert (cs.J, cs.Q) == (J, Q), name
    assert build("fnr", n_classes=K, n_groups=Z, gamma=0.1, options={"positive_class": 1}).J == 1
    assert build("fpr", n_classes=K, n_groups=Z, gamma=0.1).J == 1
    eop = build("eop", n_classes=K, n_groups=Z, gamma=0.1)
    assert eop.J == 2 * Z and eop.Q == Z + 1  # (label=1, group) cells + all other labels


def _is_refinement_minimal(cs: ConstraintSet) -> bool:
    """Brute force over all fine-cell pairs: two cells share a global cell iff every subset
    used by a constraint contains both or neither (paper Remark 1)."""
    subsets = {t.subset for c in cs.constraints for t in c.terms}
    cells = list(itertools.product(range(cs.n_classes), range(cs.n_groups)))
    for a, b in itertools.combinations(cells, 2):
        together = all((a in s) == (b in s) for s in subsets)
        if together != (cs.cell_of[a] == cs.cell_of[b]):
            return False
    return True


@pytest.mark.parametrize("name,options", CASES)
@pytest.mark.parametrize("K,Z", SHAPES)
def test_derived_partition_is_the_smallest(name, options, K, Z):
    cs = build(name, n_classes=K, n_groups=Z, gamma=0.1, options=options)
    assert _is_refinement_minimal(cs)
    # every subset is a union of global cells (so Gamma_post is exact), and Q is the number of signatures
    assert sorted(np.unique(cs.cell_of)) == list(range(cs.Q))


def test_known_partitions():
    dp = build("dp", n_classes=2, n_groups=3, gamma=0.1)
    assert (dp.cell_of == [[0, 1, 2], [0, 1, 2]]).all()  # by group
    fnr = build("fnr", n_classes=3, n_groups=2, gamma=0.1)
    assert (fnr.cell_of == [[0, 0], [1, 1], [2, 2]]).all()  # by label
    eo = build("eo", n_classes=2, n_groups=2, gamma=0.1)
    assert (eo.cell_of == [[0, 1], [2, 3]]).all()  # by (label, group)


def test_combination_uses_the_common_refinement_and_keeps_every_constraint():
    parts = [part_spec("dp", {"gamma": 0.05}, key="c"), part_spec("fnr", {"gamma": 0.2}, key="c")]
    cs = build_parts(parts, n_classes=2, n_groups=3)
    assert cs.J == 2 * 3 + 2
    assert cs.Q == 2 * 3  # group x label: the common refinement of "by group" and "by label"
    assert _is_refinement_minimal(cs)
    assert cs.families == ("dp", "fnr")
    np.testing.assert_allclose(cs.gamma, [0.05] * 6 + [0.2] * 2)
    y, group, probs = _rows(2, 3)
    H = cs.histogram(probs, cs.cells(y, group))
    expected = direct_dp(probs, y, group, 2, 3) + direct_fnr(probs, y, group, 2, 3)
    np.testing.assert_allclose(cs.gamma_post(H, floor=None), expected, atol=1e-12)


def test_positive_class_by_name_and_errors():
    names = ("neg", "pos")
    cs = build("fnr", n_classes=2, n_groups=2, gamma=0.1, options={"positive_class": "pos"}, class_names=names)
    assert cs.names == ("fnr[positive=1]",)
    with pytest.raises(ConfigError) as info:
        build("fnr", n_classes=2, n_groups=2, gamma=0.1, options={"positive_class": "yes"}, class_names=names)
    assert str(info.value) == "Unknown class 'yes' in constraint.positive_class. Available: neg, pos (or indices 0..1)."
    with pytest.raises(ConfigError) as info:
        build("eop", n_classes=2, n_groups=2, gamma=0.1, options={"positive_class": 2}, class_names=names)
    assert str(info.value) == (
        "constraint.positive_class=2 is out of range: the data has class indices 0..1 (neg, pos (or indices 0..1))."
    )


def test_group_families_need_two_groups():
    with pytest.raises(ConfigError) as info:
        build("eo", n_classes=2, n_groups=1, gamma=0.1)
    assert str(info.value) == (
        "constraint=eo compares sensitive groups, but the data has 1 group; use a dataset with at least 2 groups "
        "or a label-only constraint (fnr, fpr)."
    )
    assert build("fnr", n_classes=2, n_groups=1, gamma=0.1).J == 2


def test_unknown_option_key():
    with pytest.raises(ConfigError) as info:
        part_spec("dp", {"gamma": 0.1, "positive_class": 1}, key="constraint")
    assert str(info.value) == "Unknown key constraint.positive_class for constraint=dp. Allowed: name, gamma."


def test_an_index_does_not_pick_a_named_class_of_a_multiclass_label():
    """Issue 33, Why 5: constraint=fpr|eop on a 3-class label silently constrained the class of
    index 1 (the alphabetically second); with named classes it must be named."""
    names = ("hi", "lo", "mid")
    for family in ("fpr", "eop"):
        with pytest.raises(ConfigError) as info:
            build(family, n_classes=3, n_groups=2, gamma=0.1, class_names=names)
        assert str(info.value) == ("constraint.positive_class=1 picks the class 'lo' of 3 (hi, lo, mid) by its index; name the "
                                   "class you mean (constraint.positive_class=<name>, a list, or null for every class).")
        assert build(family, n_classes=3, n_groups=2, gamma=0.1, options={"positive_class": "mid"}, class_names=names).J >= 1
    assert build("fpr", n_classes=2, n_groups=2, gamma=0.1, class_names=("no", "yes")).J == 1  # binary: index 1 is the positive class
    assert build("fpr", n_classes=3, n_groups=2, gamma=0.1).J == 1  # unnamed classes: the index is the name
