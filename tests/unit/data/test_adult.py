"""The Adult loader: definitions, split protocol, checksums, missing-file message."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from raco_cli import data
from raco_cli.data import adult, sources
from raco_cli.errors import DataIntegrityError, DataNotFoundError

pytestmark = pytest.mark.data("adult")


def test_rows_features_labels_groups(adult):
    assert len(adult.y) == 45_222
    assert adult.n_features == 102
    assert adult.X.shape == (45_222, 102)
    assert adult.class_names == ("<=50K", ">50K") and adult.group_names == ("Male", "Female")
    assert int(adult.y.sum()) == 11_208  # >50K after dropping '?'
    assert int((adult.group == 1).sum()) == 14_695  # Female
    assert not any(name.startswith("sex") for name in adult.feature_names)  # sex is not a feature


def test_split_protocol(adult):
    n = len(adult.y)
    sizes = {s: len(ix) for s, ix in adult.splits.items()}
    assert sizes["test"] == pytest.approx(0.25 * n, abs=2)
    assert sizes["val"] == pytest.approx(0.15 * 0.75 * n, abs=2)
    assert sum(sizes.values()) == n
    all_idx = np.concatenate(list(adult.splits.values()))
    assert len(np.unique(all_idx)) == n
    # stratified by label x group: every cell's share is the same in every split
    for split, ix in adult.splits.items():
        for y in (0, 1):
            for g in (0, 1):
                share = np.mean((adult.y[ix] == y) & (adult.group[ix] == g))
                overall = np.mean((adult.y == y) & (adult.group == g))
                assert share == pytest.approx(overall, abs=0.003), (split, y, g)


def test_fixed_split_seed_and_train_only_statistics(adult, data_sources):
    data_dir, mirror = data_sources
    again = data.load("adult", data_dir=data_dir, mirror=mirror)
    for s in adult.splits:
        assert np.array_equal(adult.splits[s], again.splits[s])
    train = adult.X[adult.splits["train"]]
    numeric = [adult.feature_names.index(c) for c in ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")]
    # standardisation fitted on train only: train columns have mean 0 / std 1, test columns do not exactly
    np.testing.assert_allclose(train[:, numeric].mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train[:, numeric].std(0), 1.0, atol=1e-4)
    test = adult.X[adult.splits["test"]]
    assert np.abs(test[:, numeric].mean(0)).max() > 1e-4


def test_checksum_failure_is_detected(tmp_path, mirror_dir):
    mirror = mirror_dir("adult")
    bad = tmp_path / "adult"
    bad.mkdir()
    content = gzip.decompress((mirror / "adult.data.gz").read_bytes())
    (bad / "adult.data").write_bytes(content[: len(content) // 2])  # truncated
    (bad / "adult.test.gz").write_bytes((mirror / "adult.test.gz").read_bytes())
    with pytest.raises(DataIntegrityError, match=r"Checksum mismatch for .*adult\.data: expected sha256 5b00264637db"):
        adult.load(data_dir=tmp_path, mirror=None, allow_download=False)
    (bad / "adult.data").unlink()
    (bad / "adult.data.gz").write_bytes(b"\x1f\x8b" + b"garbage")  # corrupted gzip
    with pytest.raises(DataIntegrityError, match="truncated or corrupted"):
        adult.load(data_dir=tmp_path, mirror=None, allow_download=False)


def test_missing_file_names_the_fetch_command(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        adult.load(data_dir=tmp_path, mirror=None, allow_download=False)
    assert str(info.value) == f"Missing data file {tmp_path / 'adult' / 'adult.data'}. Download it with: make data DATASET=adult"


def test_fetch_copies_from_mirror_and_verifies(tmp_path, mirror_dir):
    paths = sources.fetch("adult", adult.FILES, data_dir=tmp_path, mirror=str(mirror_dir("adult").parent))
    assert all(p.exists() and p.parent == tmp_path / "adult" for p in paths)
    loaded = adult.load(data_dir=tmp_path, mirror=None, allow_download=False)
    assert len(loaded.y) == 45_222


def test_plain_and_gzip_files_are_both_accepted(tmp_path, mirror_dir):
    mirror = mirror_dir("adult")
    (tmp_path / "adult").mkdir()
    (tmp_path / "adult" / "adult.data").write_bytes(gzip.decompress((mirror / "adult.data.gz").read_bytes()))
    (tmp_path / "adult" / "adult.test.gz").write_bytes((mirror / "adult.test.gz").read_bytes())
    assert len(adult.load(data_dir=tmp_path, allow_download=False).y) == 45_222


def test_subset_keeps_split_structure(adult):
    small = adult.subset(500, seed=0)
    assert all(len(ix) == 500 for ix in small.splits.values())
    assert small.n_features == 102
