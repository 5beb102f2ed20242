"""``raco data describe``: a starting dataset=table config, with its privacy warning, that
composes as a dataset option (--config-dir) and loads under privacy.scope=model."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from raco_cli.cli.main import main
from raco_cli.data.fixtures import people_frame


@pytest.fixture
def people(tmp_path):
    path = tmp_path / "people.csv"
    df = people_frame(300, seed=2)
    df.to_csv(path, index=False)
    return df, path


def test_describe_prints_a_yaml_with_the_warning(capsys, people):
    df, path = people
    assert main(["data", "describe", str(path), "--label", "approved", "--sensitive", "sex"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("WARNING: the bounds and level lists below were read from the data itself; they are NOT private.")
    assert "# WARNING: the bounds and level lists below were read from the data itself" in out
    cfg = yaml.safe_load(out)
    assert cfg["defaults"] == ["table", "_self_"]
    opts = cfg["options"]
    assert opts["path"] == str(path.resolve()) and opts["label"] == "approved" and opts["sensitive"] == ["sex"]
    assert opts["types"] == {"id": "drop", "age": "numeric", "income": "numeric", "city": "categorical", "smoker": "binary"}
    assert opts["levels"]["approved"] == ["no", "yes"] and opts["levels"]["smoker"] == ["no", "yes"]  # quoted: not booleans
    assert opts["levels"]["city"] == sorted(set(df["city"]))
    assert opts["missing_indicator"] == ["income"]
    assert cfg["bounds"] == {"age": [int(df["age"].min()), int(df["age"].max())],
                             "income": [int(df["income"].min()), int(df["income"].max())]}
    assert out.count("data min/max: NOT private") == 2


def test_the_described_config_trains_under_scope_model(capsys, tmp_path, people):
    """Saved as <dir>/dataset/mine.yaml it composes (extending conf/dataset/table.yaml) and the
    loader accepts it under scope=model: every bound and level list is declared."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from raco_cli.cli.paths import CONF_DIR
    from raco_cli.cli.plugins import register_resolvers
    from raco_cli.run.prepare import load_data_uncached
    from raco_cli.run.spec import build_run_spec

    _, path = people
    main(["data", "describe", str(path), "--label", "approved", "--sensitive", "sex"])
    conf = tmp_path / "conf" / "dataset"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(capsys.readouterr().out)
    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "dataset=mine",
                                                           "dataset.bounds.income=[0,200000]"])
    finally:
        GlobalHydra.instance().clear()
    spec = build_run_spec(cfg)
    assert spec.dataset.name == "table" and spec.dataset.preprocessing == "dp" and spec.dataset.bounds["income"] == [0, 200000]
    data = load_data_uncached(spec)
    assert data.feature_names[:3] == ("age", "income", "income=missing") and data.group_names == ("F", "M")
    assert np.isfinite(data.X).all()


@pytest.mark.parametrize(("argv", "message"), [
    (["--label", "nope", "--sensitive", "sex"], "error: --label nope: "),
    (["--label", "approved", "--sensitive", "race"], "error: --sensitive race: "),
    (["--label", "approved"], "error: raco data: the following arguments are required: --sensitive"),
])  # fmt: skip
def test_describe_bad_input_is_one_line(capsys, people, argv, message):
    _, path = people
    assert main(["data", "describe", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_data_list_and_info_know_the_table(capsys, people):
    _, path = people
    assert main(["data", "list"]) == 0
    listing = capsys.readouterr().out
    assert "table" in listing and "your own file" in listing
    assert main(["data", "fetch", "table"]) == 0 and "nothing to fetch" in capsys.readouterr().out
    assert main(["data", "info", "table", "-o", f"path={path}", "-o", "label=approved", "-o", "sensitive=sex"]) == 0
    info = capsys.readouterr().out
    assert "table: 300 rows" in info and "dataset=table: 300 rows read" in info and "train split: income: " in info
