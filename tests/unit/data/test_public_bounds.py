"""dataset.preprocessing=public: scaling from declared public bounds, no data statistic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from raco_cli.data import acs, adult, credit, heart, parkinsons
from raco_cli.data.tabular import ColumnSpec, PublicBound, encode_features, parse_bounds
from raco_cli.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf" / "dataset"


def test_public_bound_maps_the_range_onto_minus_one_one_and_clips():
    b = PublicBound(10.0, 30.0)
    assert b.scale(np.array([0.0, 10.0, 20.0, 30.0, 99.0])).tolist() == [-1.0, -1.0, 0.0, 1.0, 1.0]
    log = PublicBound(0.0, 99999.0, "log1p").scale(np.array([0.0, np.expm1(np.log1p(99999.0) / 2), 1e9]))
    assert np.allclose(log, [-1.0, 0.0, 1.0])
    signed = PublicBound(-1000.0, 1000.0, "slog1p").scale(np.array([-1000.0, 0.0, 1000.0]))
    assert np.allclose(signed, [-1.0, 0.0, 1.0])
    ratio = PublicBound(1e-4, 1.0, "log").scale(np.array([1e-6, 1e-2, 2.0]))
    assert np.allclose(ratio, [-1.0, 0.0, 1.0])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"age": [90, 17]}, "dataset.bounds.age must have lo < hi"),
        ({"age": [17]}, "dataset.bounds.age must be [lo, hi]"),
        ({"age": ["a", 3]}, "dataset.bounds.age must be [lo, hi]"),
        ({"age": [0, 3, "sqrt"]}, "transform must be one of none, log, log1p, slog1p"),
        ({"age": [-5, 3, "log1p"]}, "needs lo > -1"),
        ({"age": [0, 3, "log"]}, "needs lo > 0"),
    ],
)
def test_bad_bounds_are_one_line(raw, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        parse_bounds(raw, dataset="adult")
    assert "\n" not in str(err.value)


def _table(seed=0, n=200):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"a": rng.normal(50, 10, n), "b": rng.exponential(1000, n), "c": rng.choice(["x", "y"], n)})


def test_public_encoding_of_a_row_does_not_depend_on_the_other_rows():
    """Replace every training row: the encoding of the untouched rows is unchanged under
    public bounds, and changes under the empirical (train mean/std) standardisation."""
    cols = ColumnSpec(numeric=("a", "b"), categorical={"c": ("x", "y")})
    bounds = parse_bounds({"a": [0, 100], "b": [0, 1e5, "log1p"]}, dataset="t")
    df, train = _table(), np.arange(150)
    df2 = df.copy()
    df2.iloc[train, :2] = _table(seed=1).iloc[train, :2].to_numpy() * 3.0
    rest = np.arange(150, 200)
    pub = [encode_features(d, cols, train, preprocessing="public", bounds=bounds)[0][rest] for d in (df, df2)]
    emp = [encode_features(d, cols, train)[0][rest] for d in (df, df2)]
    assert np.array_equal(pub[0], pub[1]) and not np.allclose(emp[0], emp[1])
    assert np.abs(pub[0][:, :2]).max() <= 1.0


def test_empirical_mode_is_unchanged_train_standardisation():
    df, train = _table(), np.arange(150)
    X, _ = encode_features(df, ColumnSpec(numeric=("a",)), train)
    a = df["a"].to_numpy()
    assert np.allclose(X[:, 0], (a - a[:150].mean()) / a[:150].std(), atol=1e-5)


def test_public_mode_refuses_missing_bounds_and_fitted_vocabularies():
    df, train = _table(), np.arange(150)
    with pytest.raises(ConfigError, match="dataset.bounds.b is missing"):
        encode_features(df, ColumnSpec(numeric=("a", "b")), train, preprocessing="public",
                        bounds=parse_bounds({"a": [0, 1]}, dataset="t"))
    with pytest.raises(ConfigError, match="public level list for column c"):
        encode_features(df, ColumnSpec(categorical={"c": None}), train, preprocessing="public", bounds={})


@pytest.mark.parametrize(
    ("name", "numeric"),
    [("adult", adult.NUMERIC), ("credit", credit.NUMERIC), ("parkinsons", parkinsons.feature_columns(True)),
     ("heart", heart.FEATURES), ("acs_employment", acs.NUMERIC)],
)
def test_every_dataset_declares_valid_public_bounds_for_its_numeric_columns(name, numeric):
    conf = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    assert conf["preprocessing"] == "auto"
    bounds = parse_bounds(conf["bounds"], dataset=name)
    assert set(numeric) <= set(bounds), set(numeric) - set(bounds)


def test_preprocessing_follows_the_scope_unless_set():
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.spec import build_run_spec

    def prep(*o):
        return build_run_spec(compose_config(["dataset=adult", *o])).dataset.preprocessing

    assert prep() == "dp" and prep("privacy.scope=paper") == "empirical"
    assert prep("privacy.scope=paper", "dataset.preprocessing=public") == "public"
    assert prep("dataset.preprocessing=public") == "public"
    with pytest.raises(ConfigError, match="dataset.preprocessing must be one of auto, public, dp, empirical"):
        prep("dataset.preprocessing=zscore")
    with pytest.raises(ConfigError, match="privacy.scope must be one of model, paper"):
        prep("privacy.scope=everything")
    with pytest.raises(ConfigError, match=r"privacy.selection_share must be in \(0, 1\)"):
        prep("privacy.selection_share=1.5")
