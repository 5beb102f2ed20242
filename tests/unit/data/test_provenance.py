"""Where a configured value comes from (raco_cli/data/provenance.py): public, read from the
data, or estimated privately; privacy.scope=model refuses data-derived values in one line,
privacy.scope=paper takes them (the paper's protocol)."""

from __future__ import annotations

import pytest

from raco_cli.data import provenance, table
from raco_cli.data.fixtures import people_frame
from raco_cli.errors import ConfigError

DATA_DERIVED = [
    "+dataset.bounds.age={range:[18,90],source:data}", "+dataset.bounds.income={range:[4900,265400],source:data}",
    "+dataset.options.levels={approved:[no,yes],sex:[F,M],city:{values:[Lille,Lyon,Nice,Paris],source:data},smoker:[no,yes]}",
    "dataset.options.missing_indicator={columns:[income],source:data}",
]  # fmt: skip


@pytest.fixture
def people_csv(tmp_path):
    path = tmp_path / "people.csv"
    people_frame(400, seed=2).to_csv(path, index=False)
    return path


def _cfg(path, *extra):
    from raco_cli.cli.validate import compose_config

    return compose_config(["dataset=table", f"dataset.options.path={path}", "dataset.options.label=approved",
                           "dataset.options.sensitive=[sex]", "+dataset.options.types={id:drop}", "tracking.enabled=false", *extra])


@pytest.mark.parametrize(("raw", "entry"), [
    ([18, 90], provenance.Entry([18, 90], "public")),
    ([0, 1e6, "log1p"], provenance.Entry([0, 1e6, "log1p"], "public")),
    ({"range": [18, 90], "source": "public"}, provenance.Entry([18, 90], "public")),
    ({"range": [1, 9], "source": "data", "transform": "log1p"}, provenance.Entry([1, 9, "log1p"], "data")),
    ("private", provenance.Entry(None, "private")),
    ({"source": "private", "transform": "log1p"}, provenance.Entry(None, "private", "log1p")),
])  # fmt: skip
def test_bound_forms(raw, entry):
    assert provenance.bound(raw, "dataset.bounds.x") == entry


@pytest.mark.parametrize(("raw", "message"), [
    ({"range": [1, 2], "source": "file"}, r"^dataset.bounds.x.source must be one of public, data, private \(got dataset.bounds.x.source='file'\)"),
    ({"range": [1, 2]}, r"^dataset.bounds.x.source must be one of public, data, private \(got dataset.bounds.x.source=None\)"),
    ({"range": [1, 2], "source": "private"}, r"^dataset.bounds.x is private and also gives range"),
    ({"range": [1, 2], "source": "data", "lo": 1}, r"^Unknown key dataset.bounds.x.lo. Allowed: range, source, transform."),
    ("estimate", r"^dataset.bounds.x must be \[lo, hi\], \{range: \[lo, hi\], source: public\} or private"),
])  # fmt: skip
def test_bad_forms_are_one_line(raw, message):
    with pytest.raises(ConfigError, match=message) as e:
        provenance.bound(raw, "dataset.bounds.x")
    assert "\n" not in str(e.value)


def test_scope_model_refuses_data_derived_values_in_one_line_naming_the_keys_and_the_ways_out(people_csv):
    """Issue 28, item 3: a config holding values read from the data must not train under
    privacy.scope=model with the full scope line."""
    from raco_cli.run.spec import build_run_spec

    with pytest.raises(ConfigError) as e:
        build_run_spec(_cfg(people_csv, *DATA_DERIVED))
    assert str(e.value) == (
        "dataset.bounds.age, dataset.bounds.income, dataset.options.levels.city, dataset.options.missing_indicator hold values read "
        "from the data (source: data), which privacy.scope=model does not cover: declare them public (source: public, or write the "
        "known range / code book) or let raco estimate them privately inside eps (write private); or train with privacy.scope=paper."
    )


def test_the_cli_refuses_them_before_anything_is_written(capsys, tmp_path, people_csv):
    from raco_cli.cli.main import main

    code = main(["train", "dataset=table", f"dataset.options.path={people_csv}", "dataset.options.label=approved",
                 "dataset.options.sensitive=[sex]", "+dataset.options.types={id:drop}", *DATA_DERIVED,
                 f"hydra.run.dir={tmp_path / 'run'}", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: dataset.bounds.age, dataset.bounds.income")
    assert not (tmp_path / "run").exists() and not (tmp_path / "m.db").exists()


def test_scope_paper_takes_data_derived_values_as_given(people_csv):
    from raco_cli.run.prepare import load_data_uncached
    from raco_cli.run.spec import build_run_spec

    spec = build_run_spec(_cfg(people_csv, *DATA_DERIVED, "privacy.scope=paper", "dataset.preprocessing=public"))
    data = load_data_uncached(spec)
    assert data.meta["schema"].encoder.numeric[1].bound.hi == 265400 and "income=missing" in data.feature_names
    assert [f for f in data.feature_names if f.startswith("city=")] == ["city=Lille", "city=Lyon", "city=Nice", "city=Paris", "city=other"]


def test_declared_public_values_train_under_scope_model(people_csv):
    from raco_cli.run.prepare import load_data_uncached
    from raco_cli.run.spec import build_run_spec

    public = [o.replace("source:data", "source:public") for o in DATA_DERIVED]
    data = load_data_uncached(build_run_spec(_cfg(people_csv, *public)))
    assert data.meta["schema"].encoder.numeric[0].bound.hi == 90


def test_private_values_under_empirical_preprocessing_are_read_from_the_data(people_csv):
    """scope=paper (empirical): `private` means the paper's protocol, values from the data."""
    d = table.load(path=str(people_csv), label="approved", sensitive="sex", types={"id": "drop"}, preprocessing="empirical",
                   levels={"approved": "private", "sex": "private", "city": "private", "smoker": "private"},
                   bounds={"age": "private", "income": "private"}, missing_indicator="private")
    assert not d.meta.get("pending") and d.class_names == ("no", "yes") and "income=missing" in d.feature_names


def test_the_benchmark_loaders_take_the_explicit_public_form_and_refuse_private():
    from raco_cli.data.tabular import parse_bounds

    assert parse_bounds({"a": {"range": [0, 1], "source": "public"}}, dataset="adult")["a"].hi == 1.0
    with pytest.raises(ConfigError, match=r"^dataset.bounds.a is private, which dataset=adult does not estimate"):
        parse_bounds({"a": "private"}, dataset="adult")
