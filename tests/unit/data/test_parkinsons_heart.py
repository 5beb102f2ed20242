"""The Parkinsons and Heart loaders: definitions, training-part statistics, options, files."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raco_cli import data
from raco_cli.data import heart, parkinsons
from raco_cli.errors import ConfigError, DataIntegrityError, DataNotFoundError

DATA_DIR = Path(__file__).resolve().parents[3] / "datasets"


def mirror() -> str | None:
    """Where the loaders look besides datasets/ (tests marked data(...) run only when found)."""
    return os.environ.get("RACO_DATA_MIRROR") or None


def assert_stratified(d, strata_y, tol):
    for ix in d.splits.values():
        for y in np.unique(strata_y):
            for g in range(d.n_groups):
                share = np.mean((strata_y[ix] == y) & (d.group[ix] == g))
                assert share == pytest.approx(np.mean((strata_y == y) & (d.group == g)), abs=tol)


# --- Parkinsons ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pk():
    return parkinsons.load(data_dir=DATA_DIR, mirror=mirror(), allow_download=False)


@pytest.mark.data("parkinsons")
def test_parkinsons_definitions(pk):
    raw, _ = parkinsons.read_raw(data_dir=DATA_DIR, mirror=mirror(), allow_download=False)
    assert pk.X.shape == (5_875, 19)
    assert pk.feature_names == parkinsons.feature_columns(True)
    assert not {"subject#", "sex", "total_UPDRS"} & set(pk.feature_names) and "motor_UPDRS" in pk.feature_names
    assert int((pk.group == 1).sum()) == 1_867 and pk.group_names == ("Male", "Female")  # sex 1 = female
    total = raw["total_UPDRS"].to_numpy()
    threshold = np.median(total[pk.splits["train"]])
    assert pk.meta["label_threshold"] == threshold
    np.testing.assert_array_equal(pk.y, (total > threshold).astype(int))
    assert abs(pk.y[pk.splits["train"]].mean() - 0.5) < 0.01
    assert_stratified(pk, (total > np.median(total)).astype(int), tol=0.004)  # provisional label x sex


@pytest.mark.data("parkinsons")
def test_parkinsons_label_and_scaling_ignore_test_rows(pk, monkeypatch):
    """Changing every test row changes no training statistic (label threshold, scaling)."""
    raw, src = parkinsons.read_raw(data_dir=DATA_DIR, mirror=mirror(), allow_download=False)
    test = pk.splits["test"]
    changed = raw.copy()
    cols = [c for c in raw.columns if c not in ("subject#", "sex", "total_UPDRS")]
    changed.loc[test, cols] = changed.loc[test, cols] * 7 + 100  # every feature of every test row
    # test scores moved far away, each on its side of the full-data median (the stratification
    # label, which any stratified split reads from all rows)
    total = raw["total_UPDRS"].to_numpy()
    med = np.median(total)
    shift = np.where(total[test] > med, 100.0, np.where(total[test] < med, -100.0, 0.0))
    changed.loc[test, "total_UPDRS"] = total[test] + shift
    monkeypatch.setattr(parkinsons, "read_raw", lambda **_: (changed, src))
    again = parkinsons.load(data_dir=DATA_DIR, mirror=mirror(), allow_download=False)
    for s in ("train", "val", "test"):
        np.testing.assert_array_equal(again.splits[s], pk.splits[s])
    assert again.meta["label_threshold"] == pk.meta["label_threshold"]
    train = pk.splits["train"]
    np.testing.assert_array_equal(again.X[train], pk.X[train])
    np.testing.assert_array_equal(again.y[train], pk.y[train])


@pytest.mark.data("parkinsons")
def test_parkinsons_motor_updrs_option():
    d = data.load("parkinsons", data_dir=DATA_DIR, mirror=mirror(), options={"include_motor_updrs": False})
    assert d.X.shape == (5_875, 18) and "motor_UPDRS" not in d.feature_names
    with pytest.raises(ConfigError) as info:
        data.load("parkinsons", data_dir=DATA_DIR, mirror=mirror(), options={"include_motor_updrs": "no"})
    assert str(info.value) == (
        "dataset.options.include_motor_updrs must be true or false "
        "(got dataset.options.include_motor_updrs='no'); keep motor_UPDRS among the features."
    )


@pytest.mark.data("parkinsons")
def test_parkinsons_truncated_file_fails_checksum(tmp_path, mirror_dir):
    content = gzip.decompress((mirror_dir("parkinsons") / "parkinsons_updrs.data.gz").read_bytes())
    (tmp_path / "parkinsons").mkdir()
    (tmp_path / "parkinsons" / "parkinsons_updrs.data").write_bytes(content[:-500])
    with pytest.raises(DataIntegrityError, match=r"Checksum mismatch for .*parkinsons_updrs\.data: expected sha256 f2c7d5025dec"):
        parkinsons.load(data_dir=tmp_path, mirror=None, allow_download=False)


def test_parkinsons_missing_file(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        parkinsons.load(data_dir=tmp_path, mirror=None, allow_download=False)
    assert str(info.value) == (
        f"Missing data file {tmp_path / 'parkinsons' / 'parkinsons_updrs.data'}. Download it with: make data DATASET=parkinsons"
    )


def test_unknown_option_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        data.load("parkinsons", data_dir=tmp_path, options={"motor": True})
    assert str(info.value) == (
        "Unknown key dataset.options.motor for dataset 'parkinsons'. Allowed: include_motor_updrs "
        "(see conf/dataset/parkinsons.yaml)."
    )


# --- Heart -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hd():
    return heart.load(data_dir=DATA_DIR, mirror=mirror(), allow_download=False)


@pytest.mark.data("heart")
def test_heart_definitions(hd):
    assert hd.X.shape == (253_680, 21) and hd.feature_names == heart.FEATURES
    assert int(hd.y.sum()) == 23_893
    assert hd.group_names == ("Female", "Male") and int((hd.group == 1).sum()) == 111_706
    assert int(hd.y[hd.group == 0].sum()) == 10_205  # positives among women (mirror README)
    assert_stratified(hd, hd.y, tol=0.001)
    train = hd.X[hd.splits["train"]]
    np.testing.assert_allclose(train.mean(0), 0.0, atol=1e-4)
    assert np.abs(hd.X[hd.splits["test"]].mean(0)).max() > 1e-4  # fitted on train only


@pytest.mark.data("heart")
def test_heart_sensitive_groupings():
    d = heart.load(data_dir=DATA_DIR, mirror=mirror(), allow_download=False, sensitive="Age", sensitive_as_feature=False)
    raw, _ = heart.read_raw(data_dir=DATA_DIR, mirror=mirror(), allow_download=False)
    assert d.group_names == ("18-44", "45-64", "65+") and "Age" not in d.feature_names and d.n_features == 20
    np.testing.assert_array_equal(d.group, np.digitize(raw["Age"].to_numpy(), [5.5, 9.5]))


def test_heart_grouping_rules():
    df = pd.DataFrame({"Education": [1, 4, 5, 6], "Smoker": [0, 1, 1, 0], "Income": [1, 5, 7, 8]})
    assert heart.sensitive_groups(df, "Education")[0].tolist() == [0, 0, 1, 2]
    assert heart.sensitive_groups(df, "Income")[0].tolist() == [0, 1, 2, 2]
    assert heart.sensitive_groups(df, "Smoker") == (pytest.approx([0, 1, 1, 0]), ("Smoker=0", "Smoker=1"))
    with pytest.raises(ConfigError, match=r"dataset.options.sensitive must be one of Sex, Age, Education, Income, Diabetes or a 0/1 column \(HighBP"):
        heart.grouping("BMI")


def test_heart_missing_file_explains_manual_download(tmp_path):
    for allow in (True, False):
        with pytest.raises(DataNotFoundError) as info:
            heart.load(data_dir=tmp_path, mirror=None, allow_download=allow)
        assert str(info.value) == (
            f"Missing data file {tmp_path / 'heart' / 'heart_disease_health_indicators_BRFSS2015.csv'}. "
            "Kaggle needs a login, so raco cannot download it: get it from "
            "https://www.kaggle.com/datasets/alexteboul/heart-disease-health-indicators-dataset (or run "
            "`kaggle datasets download -d alexteboul/heart-disease-health-indicators-dataset --unzip`) and put "
            "heart_disease_health_indicators_BRFSS2015.csv (gzip accepted) in datasets/heart/ or in $RACO_DATA_MIRROR/heart/"
        )


@pytest.mark.data("heart")
def test_heart_truncated_gzip_is_rejected(tmp_path, mirror_dir):
    raw = (mirror_dir("heart") / "heart_disease_health_indicators_BRFSS2015.csv.gz").read_bytes()
    (tmp_path / "heart").mkdir()
    (tmp_path / "heart" / "heart_disease_health_indicators_BRFSS2015.csv.gz").write_bytes(raw[: len(raw) // 3])
    with pytest.raises(DataIntegrityError, match="truncated or corrupted"):
        heart.load(data_dir=tmp_path, mirror=None, allow_download=False)
