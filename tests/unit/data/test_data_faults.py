"""Data faults: corrupted/truncated files, wrong columns, empty groups, single-class splits."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from specs import paper_spec

from raco_cli import constraints, models
from raco_cli.data import adult
from raco_cli.data.types import TabularData
from raco_cli.errors import DataIntegrityError
from raco_cli.methods.base import NullReporter, Seeds
from raco_cli.methods.sgda import raco_dp


def _no_checksums(monkeypatch):
    """Files without a known checksum (custom mirrors): the parser must catch bad tables."""
    files = tuple(dataclasses.replace(f, sha256=None, md5=None) for f in adult.FILES)
    monkeypatch.setattr(adult, "FILES", files)


def _write(tmp_path, data: bytes, test: bytes) -> Path:
    (tmp_path / "adult").mkdir(exist_ok=True)
    (tmp_path / "adult" / "adult.data").write_bytes(data)
    (tmp_path / "adult" / "adult.test").write_bytes(test)
    return tmp_path


ROW = b"39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K\n"


@pytest.mark.parametrize(
    "content,match",
    [
        (b"a,b,c\n1,2,3\n", r"adult\.data is not a valid 'adult' file \(lines with fewer than 15 columns\); expected 15"),
        (ROW.replace(b"<=50K", b"maybe"), r"adult\.data is not a valid 'adult' file \(unexpected labels \['maybe'\]\)"),
        (ROW + ROW.replace(b"\n", b", extra\n"), r"adult\.data is not a valid 'adult' file \(Error tokenizing data"),
        (ROW.replace(b"39,", b"old,"), r"Adult column 'age' has a non-numeric value 'old'"),
        (b"", r"adult\.data is not a valid 'adult' file \(it has no rows\)"),
    ],
)
def test_wrong_columns_give_one_line(tmp_path, monkeypatch, content, match):
    _no_checksums(monkeypatch)
    root = _write(tmp_path, content, b"|1x3 Cross validator\n" + ROW)
    with pytest.raises(DataIntegrityError, match=match) as info:
        adult.load(data_dir=root, mirror=None, allow_download=False)
    assert "\n" not in str(info.value) and str(info.value).endswith("make data DATASET=adult")


@pytest.mark.data("adult")
def test_truncated_and_corrupted_files_fail_their_checksum(tmp_path, mirror_dir):
    mirror = mirror_dir("adult")
    content = gzip.decompress((mirror / "adult.data.gz").read_bytes())
    root = _write(tmp_path, content[: len(content) - 100], gzip.decompress((mirror / "adult.test.gz").read_bytes()))
    with pytest.raises(DataIntegrityError, match=r"^Checksum mismatch for .*adult\.data: expected sha256 .*make data DATASET=adult$"):
        adult.load(data_dir=root, mirror=None, allow_download=False)
    flipped = bytearray(content)
    flipped[1000] ^= 0x01  # one flipped bit
    (root / "adult" / "adult.data").write_bytes(bytes(flipped))
    with pytest.raises(DataIntegrityError, match="Checksum mismatch"):
        adult.load(data_dir=root, mirror=None, allow_download=False)


def _table(y, group, splits, n_groups=3):
    rng = np.random.default_rng(0)
    n = len(y)
    return TabularData(
        name="faulty", X=rng.normal(size=(n, 4)).astype(np.float32), y=np.asarray(y), group=np.asarray(group),
        feature_names=tuple("abcd"), class_names=("no", "yes"), group_names=tuple(f"g{i}" for i in range(n_groups)),
        splits={k: np.asarray(v) for k, v in splits.items()},
    )


def _fit(data, steps=20):
    cons = constraints.build("dp", n_classes=2, n_groups=data.n_groups, gamma=0.05)
    model = models.build("logreg", input_shape=data.input_shape, n_classes=2)
    spec = paper_spec(name="raco_dp", batch_size=50, eval_every=10, selection="last")
    return raco_dp.fit(data, model, cons, spec, steps=steps, seeds=Seeds.from_seed(0), device=torch.device("cpu"), reporter=NullReporter())


def test_a_group_without_rows_in_a_split():
    """Documented handling: the group's per-group metrics are null, gaps use the groups
    present, its constraint rates are NaN in evaluation (skipped in the max), and training
    (noisy denominators clamped to the floor) stays finite."""
    rng = np.random.default_rng(1)
    n = 600
    y = rng.integers(0, 2, n)
    group = rng.integers(0, 3, n)
    idx = np.arange(n)
    group[idx >= 500] = rng.integers(0, 2, 100)  # group 2 absent from val and test
    group[(idx < 400) & (group == 2)] = 2
    splits = {"train": idx[:400], "val": idx[400:500][group[400:500] != 2], "test": idx[500:]}
    splits["val"] = np.setdiff1d(idx[400:500], idx[400:500][group[400:500] == 2])
    leftover = np.setdiff1d(idx[400:500], splits["val"])
    splits["train"] = np.concatenate([splits["train"], leftover])
    data = _table(y, group, splits)
    assert data.group_sizes("val")["g2"] == 0 and data.group_sizes("test")["g2"] == 0
    res = _fit(data)
    val = res.selected_record.metrics["val"]
    assert val["group_accuracy"]["g2"] is None and val["group_positive_rate"]["g2"] is None
    assert np.isfinite(val["dp_gap"]) and np.isfinite(val["constraint_max_hard"])
    assert all(torch.isfinite(v).all() for v in res.state_dict.values())


def test_a_group_without_training_rows_trains_finitely():
    rng = np.random.default_rng(2)
    n = 600
    y = rng.integers(0, 2, n)
    group = rng.integers(0, 3, n)
    group[:400][group[:400] == 2] = 0  # no training rows of group 2
    data = _table(y, group, {"train": np.arange(400), "val": np.arange(400, 500), "test": np.arange(500, 600)})
    res = _fit(data)
    assert all(torch.isfinite(v).all() for v in res.state_dict.values())
    assert all(np.isfinite(res.lam))


def test_single_class_splits():
    """Documented handling: FNR (FPR) of a split without positives (negatives) is null; the
    run and the other metrics are unaffected.  A single-class *training* split trains too."""
    rng = np.random.default_rng(3)
    n = 600
    y = rng.integers(0, 2, n)
    y[400:500] = 0  # validation: negatives only
    y[:400] = 1  # training: positives only
    data = _table(y, rng.integers(0, 2, n), {"train": np.arange(400), "val": np.arange(400, 500), "test": np.arange(500, 600)}, n_groups=2)
    res = _fit(data)
    val = res.selected_record.metrics["val"]
    assert np.isnan(val["fnr"]) and np.isfinite(val["fpr"]) and 0 <= val["accuracy"] <= 1
    from raco_cli.tracking.summary import _clean

    assert _clean(val)["fnr"] is None  # summary.json writes null, never NaN
    assert all(torch.isfinite(v).all() for v in res.state_dict.values())
