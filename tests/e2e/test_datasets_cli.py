"""End to end for the six datasets: ``raco data`` and ``raco train`` in subprocesses.

ACSEmployment and CelebA run on generated files in their upstream layouts, passed to the
subprocess through ``RACO_DATA_MIRROR``; the tabular four use the real mirror (``data``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from raco_cli.data import fixtures


def raco(*args, cwd, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "raco_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def finite_metrics(summary: dict) -> None:
    for split in ("train", "val", "test"):
        if split not in summary["metrics"]:  # privacy.scope=model writes the test split only
            continue
        m = summary["metrics"][split]
        for key in ("accuracy", "loss", "dp_gap", "constraint_max_hard"):
            assert math.isfinite(m[key]), (split, key, m[key])


@pytest.fixture(scope="module")
def generated_mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen_mirror")
    fixtures.write_acs(root, n=900)
    fixtures.write_celeba(root, n=120)
    return root


def test_train_acs_employment_on_generated_file(tmp_path, generated_mirror):
    run_dir = tmp_path / "run"
    # constraint.confidence=null: the generated file's small groups cannot support the default margin
    res = raco("train", "dataset=acs_employment", "constraint=dp", "eps=1", "method.batch_size=64", "tracking=none", "constraint.confidence=null",
               f"paths.data_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}", cwd=tmp_path,
               env={"RACO_DATA_MIRROR": str(generated_mirror)})
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dataset"] == "acs_employment" and 0 < summary["eps_spent"] <= 1.0
    assert len(summary["constraints"]) == 18  # 9 RAC1P groups, two-sided DP
    assert len(summary["group_sizes"]["test"]) == 9  # scope=model writes the held-out split's sizes only
    finite_metrics(summary)


def test_train_celeba_on_generated_images(tmp_path, generated_mirror):
    run_dir = tmp_path / "run"
    res = raco("train", "dataset=celeba", "constraint=dp", "eps=1", "method.batch_size=12", "tracking=none", "privacy.scope=paper",
               "dataset.options.image_size=16", "dataset.options.verify_checksums=false",
               f"paths.data_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}", cwd=tmp_path,
               env={"RACO_DATA_MIRROR": str(generated_mirror)})
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["dataset"] == "celeba" and 0 < summary["eps_spent"] <= 1.0
    assert summary["group_sizes"]["train"] == {"Female": 36, "Male": 36}  # official partition of the fixture
    finite_metrics(summary)


def run_main(capsys, *argv):
    """``raco data ...`` in process (the same entry point as the console script, no startup cost)."""
    from raco_cli.cli.main import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_data_info_and_list_on_generated_files(tmp_path, generated_mirror, capsys, monkeypatch):
    monkeypatch.setenv("RACO_DATA_MIRROR", str(generated_mirror))
    code, out, err = run_main(capsys, "data", "--data-dir", str(tmp_path), "info", "celeba",
                              "-o", "verify_checksums=false", "-o", "image_size=32")
    assert code == 0, err
    assert out.startswith("celeba: 120 rows, inputs 3x32x32, 2 classes, 2 groups")
    assert "  train      72 rows | labels: not Smiling=36, Smiling=36 | groups: Female=36, Male=36" in out
    code, out, err = run_main(capsys, "data", "--data-dir", str(tmp_path), "list")
    assert code == 0, err
    # the name column is as wide as the longest dataset name
    assert re.search(r"^acs_employment +present \(mirror, unverified\)", out, re.M)  # the Census publishes no checksums
    assert re.search(r"^celeba +CORRUPT", out, re.M)  # generated list files do not match the official MD5s


def test_missing_data_exits_2_with_the_fetch_command(tmp_path, capsys, monkeypatch):
    res = raco("train", "dataset=parkinsons", "dataset.download=false", "tracking=none", f"paths.data_dir={tmp_path}",
               f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env={"RACO_DATA_MIRROR": ""})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: Missing data file {tmp_path / 'parkinsons' / 'parkinsons_updrs.data'}. Download it with: make data DATASET=parkinsons"
    )
    monkeypatch.setenv("RACO_DATA_MIRROR", "")
    code, _, err = run_main(capsys, "data", "--data-dir", str(tmp_path), "fetch", "heart")
    assert code == 2 and err.startswith(f"error: Missing data file {tmp_path / 'heart'}")
    assert "Kaggle needs a login" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "data", "info", "heart", "-o", "sensitiv=Age")
    assert code == 2 and err == (
        "error: Unknown key dataset.options.sensitiv for dataset 'heart'. Allowed: sensitive, "
        "sensitive_as_feature (see conf/dataset/heart.yaml).\n"
    )


@pytest.mark.data("adult", "credit", "heart", "parkinsons")
def test_data_list_shows_the_mirror_verified(tmp_path, capsys, mirror_dir):
    for name in ("adult", "credit", "heart", "parkinsons"):
        mirror_dir(name)  # in the mirror, not only in datasets/
    code, out, err = run_main(capsys, "data", "--data-dir", str(tmp_path), "list")
    assert code == 0, err
    for name in ("adult", "credit", "heart", "parkinsons"):
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        assert "present (mirror, verified)" in line, line


@pytest.mark.parametrize("name,rows,features", [
    pytest.param(name, rows, features, marks=pytest.mark.data(name))
    for name, rows, features in (("adult", 45_222, 102), ("credit", 30_000, 85), ("parkinsons", 5_875, 19), ("heart", 253_680, 21))
])
def test_data_info_numbers(tmp_path, capsys, mirror_dir, name, rows, features):
    mirror_dir(name)  # read through the mirror (--data-dir is an empty directory)
    code, out, err = run_main(capsys, "data", "--data-dir", str(tmp_path), "info", name)
    assert code == 0, err
    assert out.startswith(f"{name}: {rows} rows, {features} features, 2 classes, 2 groups")


@pytest.mark.slow
@pytest.mark.parametrize("args", [pytest.param(["dataset=credit"], marks=pytest.mark.data("credit")),
                                  pytest.param(["experiment=parkinsons_dp"], marks=pytest.mark.data("parkinsons")),
                                  pytest.param(["experiment=heart_dp"], marks=pytest.mark.data("heart"))])
def test_train_real_tabular_datasets(tmp_path, args):
    """The acceptance runs on the mirror (minutes): eps=1, DP, finite metrics, eps spent <= 1."""
    run_dir = tmp_path / "run"
    res = raco("train", *args, "constraint=dp", "eps=1", "tracking=none", f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=1800)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < summary["eps_spent"] <= 1.0
    finite_metrics(summary)
