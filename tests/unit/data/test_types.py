"""TabularData validation and the synthetic dataset."""

from __future__ import annotations

import numpy as np
import pytest

from raco_cli.data import get
from raco_cli.data.types import TabularData
from raco_cli.errors import ConfigError, DataIntegrityError


def make(**kw):
    base = dict(
        name="t", X=np.zeros((6, 2), np.float32), y=np.array([0, 1, 0, 1, 0, 1]), group=np.array([0, 0, 1, 1, 0, 1]),
        feature_names=("a", "b"), class_names=("n", "p"), group_names=("g0", "g1"),
        splits={"train": np.array([0, 1, 2]), "val": np.array([3]), "test": np.array([4, 5])},
    )
    base.update(kw)
    return TabularData(**base)


def test_valid():
    d = make()
    assert d.group_sizes("train") == {"g0": 2, "g1": 1}


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(y=np.array([0, 1, 0, 1, 0, 2])), "label values must lie in 0..1"),
        (dict(group=np.array([0, 0, 1])), "all must be equal"),
        (dict(splits={"train": np.array([0, 1]), "val": np.array([1]), "test": np.array([4])}), "splits overlap"),
        (dict(splits={"train": np.array([0, 1]), "val": np.array([], dtype=int), "test": np.array([4])}), "split 'val' is empty"),
    ],
)
def test_invalid(kw, match):
    with pytest.raises(DataIntegrityError, match=match):
        make(**kw)


def test_unknown_dataset_message():
    with pytest.raises(ConfigError) as info:
        get("adlt")
    assert str(info.value) == "Unknown dataset 'adlt'. Available: acs_employment, adult, celeba, cifar10, credit, digits, fashion_mnist, group_mixture, heart, mnist, parkinsons, synthetic, synthetic_images, table."


def test_synthetic_has_a_disparity(synthetic):
    tr = synthetic.splits["train"]
    rates = [synthetic.y[tr][synthetic.group[tr] == g].mean() for g in range(2)]
    assert abs(rates[0] - rates[1]) > 0.1
