"""``raco data describe``: a starting dataset=table config that composes as a dataset option
(--config-dir) and trains under privacy.scope=model as written: private values, the file's own
values in comments, and what to review flagged."""

from __future__ import annotations

import numpy as np
import pandas as pd
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


def _compose(tmp_path, overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from raco_cli.cli.paths import CONF_DIR
    from raco_cli.cli.plugins import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=[f"hydra.searchpath=[file://{tmp_path / 'conf'}]", *overrides])
    finally:
        GlobalHydra.instance().clear()


def _save(tmp_path, name, text):
    conf = tmp_path / "conf" / "dataset"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / f"{name}.yaml").write_text(text)


# constraint.confidence=null: tables of a few hundred rows cannot support the default margin (the describe -> train path is tested)
SMALL = ["eps=4", "dataset.estimate_noise_multiplier=4", "method.batch_size=64", "method.max_steps=20", "tracking.enabled=false",
         "constraint.confidence=null"]


def test_describe_prints_a_yaml_whose_data_values_are_private_with_the_file_values_in_comments(capsys, people):
    df, path = people
    assert main(["data", "describe", str(path), "--label", "approved", "--sensitive", "sex"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("raco data describe: column types, bounds, level lists and missing-value indicators are written as `private`")
    cfg = yaml.safe_load(out)
    assert cfg["defaults"] == ["table", "_self_"]
    opts = cfg["options"]
    assert opts["path"] == str(path.resolve()) and opts["label"] == "approved" and opts["sensitive"] == ["sex"] and opts["name"] == "people"
    # every feature's type is private (decided by each run inside its eps, with its bounds or levels)
    assert opts["types"] == dict.fromkeys(("id", "age", "income", "city", "smoker"), "private")
    assert opts["levels"] == {"approved": "private", "sex": "private"}
    assert opts["missing_indicator"] == "private" and cfg["bounds"] == {}
    # the file's values, quoted (no YAML booleans), in the source: data form a user may copy
    assert "approved: private   # in the file: {values: ['no', 'yes'], source: data}" in out
    lo, hi = int(df["age"].min()), int(df["age"].max())
    assert f"age: private   # in the file: {{type: numeric, source: data}}: 0 missing of 300, range [{lo}, {hi}]" in out
    assert "id: private   # in the file: {type: drop, source: data}: identifier-like" in out
    assert "smoker: private   # in the file: {type: binary, source: data}: 2 levels" in out
    assert "missing_indicator: private   # in the file: {columns: ['income'], source: data}" in out
    comment = out.split("city: private   # in the file: ")[1].splitlines()[0]
    assert yaml.safe_load(comment.split("}")[0] + "}") == {"type": "categorical", "source": "data"}
    assert comment.endswith("levels " + str(sorted(set(df["city"]))))


def test_values_data_writes_the_file_values_marked_and_scope_model_refuses_them(capsys, tmp_path, people):
    from raco_cli.errors import ConfigError
    from raco_cli.run.spec import build_run_spec

    df, path = people
    assert main(["data", "describe", str(path), "--label", "approved", "--sensitive", "sex", "--values", "data"]) == 0
    out, err = capsys.readouterr()
    assert "NOT private" in err
    cfg = yaml.safe_load(out)
    assert cfg["options"]["levels"]["smoker"] == {"values": ["no", "yes"], "source": "data"}
    assert cfg["options"]["types"]["smoker"] == {"type": "binary", "source": "data"}
    assert cfg["options"]["missing_indicator"] == {"columns": ["income"], "source": "data"}
    assert cfg["bounds"]["income"] == {"range": [int(df["income"].min()), int(df["income"].max())], "source": "data"}
    _save(tmp_path, "mine", out)
    with pytest.raises(ConfigError, match=r"^dataset.bounds.age, dataset.bounds.income, dataset.options.levels.approved, .* hold values "
                                          r"read from the data \(source: data\), which privacy.scope=model does not cover"):
        build_run_spec(_compose(tmp_path, ["dataset=mine"]))
    assert build_run_spec(_compose(tmp_path, ["dataset=mine", "privacy.scope=paper"])).scope == "paper"


def test_the_described_config_trains_under_scope_model(capsys, tmp_path):
    """Saved as <dir>/dataset/mine.yaml it composes (extending conf/dataset/table.yaml) and trains
    under the default privacy.scope=model without an edit: every private value is estimated."""
    from raco_cli.run import train as train_mod

    path = tmp_path / "people.csv"
    people_frame(1000, seed=3).to_csv(path, index=False)
    main(["data", "describe", str(path), "--label", "approved", "--sensitive", "sex"])
    _save(tmp_path, "mine", capsys.readouterr().out)
    summary = train_mod.train(_compose(tmp_path, ["dataset=mine", *SMALL]), run_dir=tmp_path / "run")
    assert summary["privacy_scope"] == "model" and summary["eps_spent"] <= 4.0 and summary["dataset"] == "people"
    assert summary["estimates"]["levels"]["approved"] == ["no", "yes"] and "GaussianDpEvent(noise_multiplier=4" in summary["event"]


def test_describe_on_a_messy_file(capsys, tmp_path):
    """Why 4 and 5: the raw file of a new user, ';'-separated, with a duplicated header, a numeric
    id, an empty column, a column that leaks the label, a numeric column with '?' cells and free
    text; the output names each and trains as written."""
    from raco_cli.run import train as train_mod

    rng = np.random.default_rng(0)
    n = 600
    y = rng.integers(0, 2, n)
    score = np.clip(y * 4 + rng.integers(1, 7, n), 1, 10)
    df = pd.DataFrame({
        "id": np.arange(1000, 1000 + n), "name": [f"person {i}" for i in range(n)], "age": rng.integers(18, 80, n),
        "priors": [str(v) if i % 40 else "?" for i, v in enumerate(rng.integers(0, 9, n))], "notes": [""] * n,
        "decile_score": score, "recid": np.where(y == 1, "yes", "no"), "race": rng.choice(["a", "b", "c"], n),
        "two_year": np.where(y == 1, "1", "0"), "decile_score2": score, "smoker": rng.choice(["no", "yes"], n),
        "year": rng.integers(2010, 2016, n),
    })  # fmt: skip
    path = tmp_path / "raw.csv"
    path.write_text(df.to_csv(index=False, sep=";").replace("decile_score2", "decile_score", 1))
    assert main(["data", "describe", str(path), "--label", "recid", "--sensitive", "race"]) == 0
    out, err = capsys.readouterr()
    cfg = yaml.safe_load(out)
    opts = cfg["options"]
    assert opts["delimiter"] == ";"
    types = opts["types"]
    # the second copy of a duplicated header is dropped by the header (public); every other type is private
    assert types["decile_score.1"] == "drop" and {types[c] for c in ("id", "name", "notes", "priors")} == {"private"}
    assert "decile_score.1: drop   # a copy of a duplicated header name; in the file: identical to 'decile_score'" in out
    assert "the header names 'decile_score' 2 times (positions 6, 10)" in out
    assert "notes: private   # in the file: {type: drop, source: data}: empty: no value in 600 rows" in out
    assert "REVIEW two_year: predicts recid alone" in out and "review two_year: predicts recid alone" in err
    assert "REVIEW priors: numbers but for '?' (15 cells): if they mark missing values, describe again with --na-value '?'" in out
    assert "'notes'" not in out.split("missing_indicator")[1].splitlines()[0]  # a dropped column is never an indicator
    assert "REVIEW year: narrow range far from 0 (2010 to 2015): private bounds are whole octaves" in out
    assert types["smoker"] == "private" and cfg["bounds"] == {} and opts["missing_indicator"] == "private"
    assert main(["data", "describe", str(path), "--label", "recid", "--sensitive", "race", "--na-value", "?", "--values", "data"]) == 0
    fixed = yaml.safe_load(capsys.readouterr().out)
    assert fixed["options"]["types"]["priors"] == {"type": "numeric", "source": "data"}
    assert fixed["options"]["missing_indicator"]["columns"] == ["priors"]
    _save(tmp_path, "raw", out)  # the private config trains as written (the ';' file read with the delimiter it names)
    # 9 private types weigh 2 each in the release (M = 20): sigma 2 keeps tau (~48) well below the ~120 training rows of a race
    small = [o if not o.startswith("dataset.estimate_noise_multiplier=") else "dataset.estimate_noise_multiplier=2" for o in SMALL]
    summary = train_mod.train(_compose(tmp_path, ["dataset=raw", *small]), run_dir=tmp_path / "run")
    assert summary["dataset"] == "raw" and summary["estimates"]["levels"]["race"] == ["a", "b", "c"]
    # decided by the release: the empty column and the free text are dropped, '?' read as missing in priors
    est_types = summary["estimates"]["types"]
    assert est_types["notes"] == "drop" and est_types["name"] == "drop" and est_types["priors"] == "numeric", est_types


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
