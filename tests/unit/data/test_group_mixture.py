"""dataset=group_mixture: the DPSE paper's OLS generation model, its options and one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from raco_cli.data import group_mixture
from raco_cli.errors import ConfigError


def test_each_group_follows_its_own_linear_model():
    """Per group, OLS on the generated rows recovers beta_k and the residual variance sigma_k^2."""
    d = group_mixture.load(K=3, sizes=[20000, 8000, 8000], slopes=[[1.0, -2.0], 3.0, [0.0, 0.5]], noise=[1.0, 0.5, 2.0], P=2,
                           eval_size=10, seed=4)
    assert d.task == "regression" and d.n_classes == 1 and d.X.shape[1] == 2
    train = d.splits["train"]
    for k, (beta, sigma) in enumerate((([1.0, -2.0], 1.0), ([3.0, 3.0], 0.5), ([0.0, 0.5], 2.0))):
        rows = train[d.group[train] == k]
        X, t = d.X[rows].astype(np.float64), d.target[rows]
        est, *_ = np.linalg.lstsq(X, t, rcond=None)
        np.testing.assert_allclose(est, beta, atol=5 * sigma / np.sqrt(len(rows)))
        assert np.var(t - X @ est) == pytest.approx(sigma**2, rel=0.05)
        assert abs(X.mean()) < 0.05 and np.var(X) == pytest.approx(1.0, rel=0.05)  # x ~ N(0, I)


def test_sizes_splits_and_determinism():
    d = group_mixture.load(K=5, ratio=20, largest=10000, slopes=[0, 1, 2, 3, 4], eval_size=300, seed=1)
    assert d.group_sizes("train") == {"group1": 10000, "group2": 4729, "group3": 2236, "group4": 1057, "group5": 500}
    assert d.group_sizes("test") == d.group_sizes("val") == {f"group{k}": 300 for k in range(1, 6)}
    again = group_mixture.load(K=5, ratio=20, largest=10000, slopes=[0, 1, 2, 3, 4], eval_size=300, seed=1)
    np.testing.assert_array_equal(d.target, again.target)
    other = group_mixture.load(K=5, ratio=20, largest=10000, slopes=[0, 1, 2, 3, 4], eval_size=300, seed=2)
    assert not np.array_equal(d.target, other.target)
    assert d.meta["preprocessing"] == "none" and d.subset(50).target is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"K": 3, "slopes": [1, 2]}, "dataset.options.slopes must have one entry per group (K=3, got 2: [1, 2]); see conf/dataset/group_mixture.yaml."),
        ({"K": 2, "slopes": [[1, 2], 3], "P": 1}, "dataset.options.slopes[0] must have P=1 entries (got [1, 2]); see conf/dataset/group_mixture.yaml."),
        ({"noise": 0}, "dataset.options.noise[0] must be a positive finite number (got dataset.options.noise[0]=0); see conf/dataset/group_mixture.yaml."),
        ({"ratio": 0.5}, "dataset.options.ratio must be >= 1 (got dataset.options.ratio=0.5): largest / smallest group; see conf/dataset/group_mixture.yaml."),
        ({"K": 0}, "dataset.options.K must be an integer in [1, 1000] (got dataset.options.K=0); see conf/dataset/group_mixture.yaml."),
        ({"sizes": [10, "a"]}, "dataset.options.sizes[1] must be an integer in [1, 10000000] (got dataset.options.sizes[1]='a'); see conf/dataset/group_mixture.yaml."),
        ({"slopes": None}, "dataset.options.slopes must list one slope per group (got null); see conf/dataset/group_mixture.yaml."),
    ],
)
def test_bad_options_fail_in_one_line(kwargs, message):
    with pytest.raises(ConfigError) as exc:
        group_mixture.load(**kwargs)
    assert str(exc.value) == message
