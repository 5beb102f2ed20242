"""The built wheel runs anywhere: it carries its configs (raco_cli/conf, raco_cli/sweeps), so
``raco train`` from an empty directory composes, trains and writes as from a checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_carries_its_configs_and_trains_from_an_empty_directory(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                            str(ROOT)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("raco_cli-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "raco_cli/conf/config.yaml" in names and "raco_cli/conf/debug/default.yaml" in names
    assert "raco_cli/conf/sweep/fig4_adult.yaml" in names and "raco_cli/sweeps/fig4_adult.yaml" in names
    # installed beside this venv's dependencies, imported before the checkout's editable install
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import raco_cli; print(raco_cli.__file__)"], cwd=empty, env=env, capture_output=True,
                           text=True, timeout=60)
    assert where.stdout.strip().startswith(str(target)), where.stdout
    run = subprocess.run([sys.executable, "-m", "raco_cli", "train", "debug=default", "dataset=synthetic", "privacy.secure_rng=false"],
                         cwd=empty, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    summaries = list((empty / "outputs" / "runs").rglob("summary.json"))
    assert len(summaries) == 1 and json.loads(summaries[0].read_text())["dataset"] == "synthetic"
    assert not (empty / "datasets").exists() or (empty / "datasets").is_dir()  # (the download cache: the working directory's)
