"""A private search writes to a directory of its own (issue 57: a second search, on another
table, replaced the first one's ``outputs/tune/private-raco_dp-table-.../best``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raco_cli.cli.tune_dirs import check_free, claim, run_dir_override
from raco_cli.errors import ConfigError
from raco_cli.run.private_search import study_name


def test_searches_of_one_study_take_the_next_free_number(tmp_path):
    first = claim(tmp_path / "tune", "private-x")
    second = claim(tmp_path / "tune", "private-x")
    assert (first.name, second.name) == ("private-x-1", "private-x-2") and first.is_dir() and second.is_dir()
    (tmp_path / "tune" / "private-x-3").mkdir()  # taken by someone else meanwhile: skipped, never shared
    assert claim(tmp_path / "tune", "private-x").name == "private-x-4"
    assert claim(tmp_path / "tune", "private-y").name == "private-y-1"


def test_hydra_run_dir_is_the_search_directory_and_is_never_reused(tmp_path):
    target = tmp_path / "mine"
    assert run_dir_override(["eps=1", f"hydra.run.dir={target}"]) == target
    assert claim(tmp_path / "tune", "private-x", target) == target and not (tmp_path / "tune").exists()
    (target / "best").mkdir()
    with pytest.raises(ConfigError) as err:
        check_free(target)
    assert str(err.value) == (f"hydra.run.dir={target} already holds a search's result ({target / 'best'}); a search never "
                              "replaces another: give a new directory, or leave hydra.run.dir out (tune.out/<study>-<k>).")
    with pytest.raises(ConfigError, match="already holds a search's result"):
        claim(tmp_path / "tune", "private-x", target)
    with pytest.raises(ConfigError, match="hydra.run.dir is empty"):
        run_dir_override(["hydra.run.dir="])


def test_the_study_is_named_after_the_dataset_as_its_runs_are():
    """dataset=table: the table's own name (dataset.options.name, else the file's stem), not "table"."""
    def spec(name, title):
        return SimpleNamespace(method=SimpleNamespace(name="raco_dp"), constraint=SimpleNamespace(name="dp", gamma=0.05), eps=1.0,
                               dataset=SimpleNamespace(name=name, display=title or name))

    assert study_name(spec("table", "people")) == "private-raco_dp-people-dp-eps1-gamma0.05"
    assert study_name(spec("table", "credit5k")) != study_name(spec("table", "people"))
    assert study_name(spec("adult", "")) == "private-raco_dp-adult-dp-eps1-gamma0.05"
