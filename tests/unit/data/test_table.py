"""dataset=table: reading, column types, the missing / unknown-level / out-of-bound rules,
labels (binary, threshold, multi-class), intersectional groups, and what may be logged."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from raco_cli import data
from raco_cli.data import table
from raco_cli.data.fixtures import people_frame
from raco_cli.errors import ConfigError, DataIntegrityError, DataNotFoundError

LEVELS = {"approved": ["no", "yes"], "sex": ["F", "M"], "city": ["Paris", "Lyon", "Nice", "Lille"], "smoker": ["no", "yes"]}
BOUNDS = {"age": [18, 100], "income": [0, 200000]}


def _csv(tmp_path, df: pd.DataFrame, name: str = "t.csv") -> str:
    path = tmp_path / name
    df.to_csv(path, index=False)
    return str(path)


def _load(path, **kw):
    opts = {"label": "approved", "sensitive": "sex", "types": {"id": "drop"}, "levels": LEVELS}
    opts.update(kw)
    pre = opts.pop("preprocessing", "public")
    bounds = opts.pop("bounds", BOUNDS)
    return table.load(path=path, preprocessing=pre, bounds=bounds, **opts)


@pytest.fixture(scope="module")
def people(tmp_path_factory):
    df = people_frame(400, seed=0)
    return df, _csv(tmp_path_factory.mktemp("people"), df)


def test_column_types_and_their_encoding(people):
    df, path = people
    d = _load(path, types={"id": "drop", "smoker": "binary"})
    assert d.feature_names == ("age", "income", "smoker", "city=Paris", "city=Lyon", "city=Nice", "city=Lille", "city=other")
    assert d.class_names == ("no", "yes") and d.group_names == ("F", "M")
    assert d.meta["numeric_features"] == 2 and d.preprocessing == "public"
    rows = d.meta["file_rows"]
    src = df.iloc[rows].reset_index(drop=True)
    # numeric: clipped to the public bounds, mapped onto [-1, 1]; missing -> 0 (the midpoint)
    age = np.clip(src["age"].to_numpy(float), 18, 100)
    assert np.allclose(d.X[:, 0], 2 * (age - 18) / 82 - 1, atol=1e-6)
    inc = src["income"].astype("float64").to_numpy()
    assert np.allclose(d.X[:, 1], np.where(np.isnan(inc), 0.0, 2 * np.clip(inc, 0, 2e5) / 2e5 - 1), atol=1e-6)
    # binary: 1 for the second level; categorical: one-hot in the declared order
    assert (d.X[:, 2] == (src["smoker"] == "yes")).all()
    for j, city in enumerate(LEVELS["city"]):
        assert (d.X[:, 3 + j] == (src["city"] == city)).all()
    assert d.X[:, 7].sum() == 0  # no unknown city
    assert (d.y == (src["approved"] == "yes")).all() and (d.group == (src["sex"] == "M")).all()


def test_types_are_inferred_from_bounds_levels_then_storage(tmp_path, people):
    df, path = people
    d = _load(path, levels={**LEVELS}, types={"id": "drop"}, preprocessing="empirical", bounds={})
    # age/income: numbers in the file -> numeric; city/smoker: levels -> categorical
    assert d.feature_names[:2] == ("age", "income") and "smoker=yes" in d.feature_names
    # a declared type wins; drop removes the column; bool storage (Parquet) -> binary
    d2 = _load(path, types={"id": "drop", "age": "categorical"}, preprocessing="empirical", bounds={"income": [0, 2e5]})
    assert "age=18" in d2.feature_names and "id" not in " ".join(d2.feature_names)
    pq = df.assign(smoker=df["smoker"] == "yes")
    pq.to_parquet(tmp_path / "b.parquet")
    d3 = table.load(path=str(tmp_path / "b.parquet"), label="approved", sensitive="sex", types={"id": "drop"},
                    levels={"city": LEVELS["city"]}, preprocessing="empirical")
    assert "smoker" in d3.feature_names and set(np.unique(d3.X[:, d3.feature_names.index("smoker")])) == {0.0, 1.0}


def test_parquet_gzip_and_plain_csv_give_the_same_data(tmp_path, people):
    df, path = people
    df.to_parquet(tmp_path / "p.parquet")
    df.to_csv(tmp_path / "p.csv.gz", index=False, compression="gzip")
    df.iloc[:150].to_csv(tmp_path / "a.csv", index=False)
    df.iloc[150:].to_csv(tmp_path / "b.csv", index=False)
    ref = _load(path)
    for other in (str(tmp_path / "p.parquet"), str(tmp_path / "p.csv.gz"), [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]):
        d = _load(other)
        assert np.array_equal(d.X, ref.X) and np.array_equal(d.y, ref.y) and np.array_equal(d.group, ref.group), other
        assert all(np.array_equal(d.splits[s], ref.splits[s]) for s in data.SPLITS)


def _small():
    return pd.DataFrame({
        "x": ["1", "", "250", "-3", "7", "NA"] * 10,
        "c": ["a", "b", "zz", None, "a", "b"] * 10,
        "f": ["n", "y", "?", "y", "maybe", "n"] * 10,
        "s": ["F", "M"] * 30,
        "t": (["t0", "t1"] * 3) * 10,
    })


def test_missing_values_are_imputed_with_an_indicator_or_dropped_and_counted(tmp_path):
    path = _csv(tmp_path, _small())
    common = dict(label="t", sensitive="s", types={"f": "binary"}, levels={"t": ["t0", "t1"], "s": ["F", "M"], "c": ["a", "b"], "f": ["n", "y"]},
                  bounds={"x": [0, 100]}, na_values=["?"])
    d = table.load(path=path, missing_indicator=["x", "c"], preprocessing="public", **common)
    assert d.feature_names == ("x", "x=missing", "c=missing", "f", "c=a", "c=b", "c=other")
    x_missing = np.isin(np.arange(60) % 6, [1, 5])  # "" and "NA"
    assert (d.X[:, 1] == x_missing).all() and (d.X[x_missing, 0] == 0.0).all()
    c_missing = np.arange(60) % 6 == 3
    assert (d.X[:, 2] == c_missing).all() and (d.X[c_missing, 4:].sum(axis=1) == 0).all()
    f = d.X[:, 3]
    assert (f[np.arange(60) % 6 == 2] == 0.5).all()  # "?" is missing (na_values) -> 0.5
    assert (f[np.arange(60) % 6 == 4] == 0.5).all()  # "maybe" is unknown -> 0.5
    total = {k: sum(d.meta["repairs"][s].get("x", {}).get(k, 0) for s in data.SPLITS) for k in ("missing", "clipped")}
    assert total == {"missing": 20, "clipped": 20}  # 250 and -3
    assert sum(d.meta["repairs"][s].get("f", {}).get("missing", 0) for s in data.SPLITS) == 10
    dropped = table.load(path=path, missing="drop", preprocessing="public", **common)
    keep = ~np.isin(np.arange(60) % 6, [1, 2, 3, 5])
    assert len(dropped.y) == keep.sum() == 20 and dropped.meta["dropped"] == {"feature missing (missing: drop)": 40}
    assert (dropped.meta["file_rows"] == np.flatnonzero(keep)).all()


def test_unknown_levels_go_to_other_or_to_no_column(tmp_path):
    path = _csv(tmp_path, _small())
    common = dict(label="t", sensitive="s", levels={"t": ["t0", "t1"], "s": ["F", "M"], "c": ["a", "b"], "f": ["n", "y"]},
                  bounds={"x": [0, 100]}, features=["x", "c"], preprocessing="public")
    other = table.load(path=path, **common)
    zz = np.arange(60) % 6 == 2
    assert (other.X[:, other.feature_names.index("c=other")] == zz).all()
    assert sum(other.meta["repairs"][s]["c"]["unknown"] for s in data.SPLITS if "c" in other.meta["repairs"][s]) == 10
    zero = table.load(path=path, unknown="zero", **common)
    assert "c=other" not in zero.feature_names and (zero.X[zz][:, 1:].sum(axis=1) == 0).all()


def test_out_of_bound_values_are_clipped_and_counted(tmp_path):
    df = pd.DataFrame({"x": np.linspace(-50, 150, 40), "s": ["F", "M"] * 20, "t": ["a", "a", "b", "b"] * 10})
    d = table.load(path=_csv(tmp_path, df), label="t", sensitive="s", levels={"t": ["a", "b"], "s": ["F", "M"]},
                   bounds={"x": [0, 100]}, preprocessing="public")
    assert d.X[:, 0].min() == -1.0 and d.X[:, 0].max() == 1.0
    clipped = sum(d.meta["repairs"][s].get("x", {}).get("clipped", 0) for s in data.SPLITS)
    assert clipped == int(((df["x"] < 0) | (df["x"] > 100)).sum())


def test_label_rules_positive_threshold_and_multiclass(tmp_path):
    df = pd.DataFrame({"x": np.arange(60.0), "s": ["F", "M"] * 30, "t": ["lo", "mid", "hi"] * 20, "v": np.arange(60.0)})
    path = _csv(tmp_path, df)
    base = dict(sensitive="s", features=["x"], levels={"s": ["F", "M"]}, bounds={"x": [0, 60]}, preprocessing="public")
    multi = table.load(path=path, label="t", **{**base, "levels": {"s": ["F", "M"], "t": ["lo", "mid", "hi"]}})
    assert multi.n_classes == 3 and multi.class_names == ("lo", "mid", "hi") and (multi.y == np.arange(60) % 3).all()
    pos = table.load(path=path, label="t", positive=["hi", "mid"], **base)
    assert pos.class_names == ("not hi|mid", "hi|mid") and (pos.y == (np.arange(60) % 3 > 0)).all()
    thr = table.load(path=path, label="v", threshold=29.5, **base)
    assert thr.class_names == ("<= 29.5", "> 29.5") and (thr.y == (np.arange(60) > 29.5)).all()
    named = table.load(path=path, label="v", threshold=29.5, class_names=["low", "high"], **base)
    assert named.class_names == ("low", "high")
    inferred = table.load(path=path, label="t", sensitive="s", features=["x"], preprocessing="empirical")  # scope=paper
    assert inferred.class_names == ("hi", "lo", "mid")


def test_two_sensitive_columns_make_intersectional_groups(tmp_path):
    df = pd.DataFrame({"x": np.arange(80.0), "sex": ["F", "M"] * 40, "race": ["a", "a", "b", "b", "c"] * 16, "t": ["n", "y", "y", "n"] * 20})
    df.loc[0, "race"] = "unlisted"
    df.loc[1, "sex"] = None
    d = table.load(path=_csv(tmp_path, df), label="t", sensitive=["sex", "race"], features=["x"],
                   levels={"t": ["n", "y"], "sex": ["F", "M"], "race": ["a", "b"]}, bounds={"x": [0, 80]}, preprocessing="public")
    assert d.group_names == ("F&a", "F&b", "M&a", "M&b") and d.n_groups == 4
    kept = df.iloc[d.meta["file_rows"]]
    expect = (kept["sex"] == "M").to_numpy() * 2 + (kept["race"] == "b").to_numpy()
    assert (d.group == expect).all()
    # race c (16 rows) and the unlisted one are not in the list; the missing sex is dropped too
    assert d.meta["dropped"] == {"sensitive value missing": 1, "sensitive value not in its level list": 17}
    assert len(d.y) == 80 - 18


def test_scope_model_needs_public_bounds_and_levels(people):
    _, path = people
    with pytest.raises(ConfigError, match=r"^dataset.bounds.income is missing: .*privacy.scope=model.*raco data describe") as e:
        _load(path, bounds={"age": [18, 100]})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^dataset.options.levels.city is missing"):
        _load(path, levels={k: v for k, v in LEVELS.items() if k != "city"})
    with pytest.raises(ConfigError, match=r"^dataset.options.levels.sex is missing: .*sensitive"):
        _load(path, levels={k: v for k, v in LEVELS.items() if k != "sex"})
    with pytest.raises(ConfigError, match=r"^dataset.options.levels.approved is missing: .*classes"):
        _load(path, levels={k: v for k, v in LEVELS.items() if k != "approved"})
    # scope=paper (empirical): the same config loads, statistics from the training part
    d = _load(path, levels={}, bounds={}, preprocessing="empirical")
    assert d.preprocessing == "empirical" and d.class_names == ("no", "yes")


@pytest.mark.parametrize(("kw", "message"), [
    ({"label": "nope"}, r"^dataset.options.label names the column 'nope', which the file lacks. Columns: id, age"),
    ({"sensitive": ["sex", "zz"]}, r"^dataset.options.sensitive names the column 'zz'"),
    ({"types": {"id": "text"}}, r"^dataset.options.types.id must be one of numeric, categorical, binary, drop"),
    ({"missing": "mean"}, r"^dataset.options.missing must be one of impute, drop"),
    ({"unknown": "skip"}, r"^dataset.options.unknown must be one of other, zero"),
    ({"positive": "yes", "threshold": 1}, r"^dataset.options.positive and dataset.options.threshold are both set"),
    ({"bounds": {**BOUNDS, "city": [0, 1]}}, r"^dataset.bounds.city and dataset.options.levels.city are both set"),
    ({"bounds": {**BOUNDS, "city": [0, 1]}, "types": {"id": "drop", "city": "categorical"}}, r"^dataset.bounds.city is set, but city is categorical"),
    ({"levels": {**LEVELS, "age": [1, 2]}, "types": {"id": "drop", "age": "numeric"}}, r"^dataset.options.levels.age is set, but age is numeric"),
    ({"missing_indicator": ["sex"]}, r"^dataset.options.missing_indicator names 'sex', which is not a feature"),
    ({"class_names": ["a"]}, r"^dataset.options.class_names must list 2 distinct names"),
    ({"sensitive": None}, r"^dataset.options.sensitive is not set"),
    ({"label": None}, r"^dataset.options.label must be the name of the label column"),
    ({"types": "{id:drop}"}, r"^dataset.options.types must be a mapping column -> value"),
])
def test_bad_options_are_one_line_config_errors(people, kw, message):
    _, path = people
    with pytest.raises(ConfigError, match=message) as e:
        _load(path, **kw)
    assert "\n" not in str(e.value)


def test_bad_files_are_one_line(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"^dataset.options.path: no file .*nothere.csv"):
        table.load(path=str(tmp_path / "nothere.csv"), label="t", sensitive="s")
    with pytest.raises(ConfigError, match=r"^dataset.options.path is not set"):
        table.load(label="t", sensitive="s")
    (tmp_path / "empty.csv").write_text("a,b\n")
    with pytest.raises(DataIntegrityError, match="has no rows"):
        table.load(path=str(tmp_path / "empty.csv"), label="a", sensitive="b")
    (tmp_path / "bin.parquet").write_bytes(b"PAR1garbage")
    with pytest.raises(DataIntegrityError, match="is not a readable CSV or Parquet file"):
        table.load(path=str(tmp_path / "bin.parquet"), label="a", sensitive="b")
    df = pd.DataFrame({"x": ["1", "2", "three"] * 10, "s": ["F", "M", "F"] * 10, "t": ["a", "b", "a"] * 10})
    with pytest.raises(DataIntegrityError, match=r"column 'x' is numeric but row 3 holds 'three'.*na_values") as e:
        table.load(path=_csv(tmp_path, df), label="t", sensitive="s", types={"x": "numeric"})
    assert "\n" not in str(e.value)


def test_public_encoding_does_not_depend_on_other_rows_and_empirical_fits_on_train(people):
    """Public: replacing every other row leaves a row's encoding unchanged.  Empirical: the
    statistics come from the training part only (changing test rows changes nothing)."""
    df, path = people
    ref = _load(path)
    test = ref.splits["test"]
    other = np.setdiff1d(np.arange(len(df)), ref.meta["file_rows"][test])
    df2 = df.copy()
    df2.loc[other, "age"] = 100 - df2.loc[other, "age"]
    df2.loc[other, "city"] = "Paris"
    tmp = path.replace(".csv", "_2.csv")
    df2.to_csv(tmp, index=False)
    moved = _load(tmp)
    assert np.array_equal(moved.X[test], ref.X[test])
    emp = _load(path, preprocessing="empirical")
    df3 = df.copy()
    df3.loc[ref.meta["file_rows"][test], "age"] = 18
    df3.to_csv(tmp, index=False)
    emp3 = _load(tmp, preprocessing="empirical")
    train = ref.splits["train"]
    assert np.array_equal(emp3.X[train], emp.X[train])


def test_report_lines_give_only_test_counts_under_scope_model(tmp_path):
    path = _csv(tmp_path, _small())
    d = table.load(path=path, label="t", sensitive="s", levels={"t": ["t0", "t1"], "s": ["F", "M"], "c": ["a", "b"], "f": ["n", "y"]},
                   bounds={"x": [0, 100]}, types={"f": "binary"}, na_values=["?"], preprocessing="public")
    exact = "\n".join(table.report_lines(d, exact=True))
    private = table.report_lines(d, exact=False)
    assert "train split:" in exact and "val split:" in exact and "test split:" in exact
    assert not any(line.startswith(("train split", "val split")) for line in private)
    assert any(line.startswith("test split: x: ") for line in private)
    assert "exact statistics: not logged under privacy.scope=model" in private[-1]


def test_subset_keeps_the_per_row_masks_aligned(people):
    _, path = people
    d = _load(path)
    sub = d.subset(30, seed=1)
    assert sub.meta["numeric_missing"].shape == (len(sub.y), 2)
    orig = {int(r): i for i, r in enumerate(d.meta["file_rows"])}
    idx = [orig[int(r)] for r in sub.meta["file_rows"]]
    assert np.array_equal(sub.meta["numeric_missing"], d.meta["numeric_missing"][idx]) and np.array_equal(sub.X, d.X[idx])


def test_registry_loads_table_through_dataset_options(people):
    _, path = people
    d = data.load("table", data_dir=".", options={"path": path, "label": "approved", "sensitive": ["sex"], "types": {"id": "drop"}},
                  preprocessing="empirical")
    assert d.name == "table" and d.n_classes == 2
    with pytest.raises(ConfigError, match=r"^Unknown key dataset.options.colour for dataset 'table'"):
        data.load("table", data_dir=".", options={"path": path, "colour": 1})


@pytest.mark.data("adult")
def test_adult_through_table_encodes_exactly_as_the_adult_loader():
    """docs/examples/conf/dataset/adult_table.yaml on the mirror's DP-FERMI CSVs: the same rows,
    split, labels, groups and (bit for bit) features as dataset=adult, in both preprocessing modes."""
    import os
    from pathlib import Path

    from omegaconf import OmegaConf

    mirror = os.environ["RACO_DATA_MIRROR"]
    if not (Path(mirror) / "adult" / "adult_data.csv.gz").is_file():
        pytest.skip("the mirror has no adult_data.csv.gz")
    cfg = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[3] / "docs/examples/conf/dataset/adult_table.yaml"))
    opts = {k: v for k, v in cfg["options"].items()}
    opts["path"] = [p.replace("${oc.env:RACO_DATA_MIRROR}", mirror) for p in opts["path"]]
    for mode in ("public", "empirical"):
        t = data.load("table", data_dir=".", options=opts, preprocessing=mode, bounds=cfg["bounds"])
        a = data.load("adult", data_dir=Path("datasets"), mirror=mirror, preprocessing=mode,
                      bounds=OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[3] / "conf/dataset/adult.yaml"))["bounds"])
        assert t.feature_names == a.feature_names and t.group_names == a.group_names and t.class_names == a.class_names
        assert np.array_equal(t.X, a.X) and np.array_equal(t.y, a.y) and np.array_equal(t.group, a.group)
        assert {s: len(v) for s, v in t.splits.items()} == {"train": 28828, "val": 5088, "test": 11306}
        assert all(np.array_equal(t.splits[s], a.splits[s]) for s in data.SPLITS)
        assert t.meta["rows_read"] == 48842 and t.meta["dropped"] == {"feature missing (missing: drop)": 3620}


def test_a_small_table_with_many_cells_still_splits():
    """Fewer validation rows than (label, group) cells: stratified by label, not refused."""
    from raco_cli.data.tabular import stratified_split

    rng = np.random.default_rng(0)
    y, g = rng.integers(0, 2, 63), rng.integers(0, 4, 63)
    splits = stratified_split(y, g, seed=0)
    assert sorted(np.concatenate(list(splits.values()))) == list(range(63))
    big_y, big_g = rng.integers(0, 2, 4000), rng.integers(0, 2, 4000)
    assert np.array_equal(stratified_split(big_y, big_g, seed=3)["test"], stratified_split(big_y, big_g, seed=3)["test"])


# --- no silent wrong answers (issue 33, Why 1 and 5) -------------------------------------------


def _credit(tmp_path, labels=("good", "bad"), name="credit.csv", sep=","):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"amount": rng.integers(100, 5000, 80), "sex": ["F", "M"] * 40,
                       "class": [labels[i % 2] for i in range(80)], "own": ["no", "yes", "yes", "no"] * 20})
    path = tmp_path / name
    df.to_csv(path, index=False, sep=sep)
    return str(path)


@pytest.mark.parametrize(("labels", "positive", "message"), [
    (("good", "bad"), "Good", r"^dataset.options.positive=Good does not occur in the label column 'class' \(its values: bad, good\)"),
    (("1", "2"), 3, r"^dataset.options.positive=3 does not occur in the label column 'class' \(its values: 1, 2\)"),
    (("1", "2"), [2, 3], r"^dataset.options.positive=3 does not occur"),
])  # fmt: skip
def test_a_positive_value_the_label_never_holds_is_an_error(tmp_path, labels, positive, message):
    """Why 1: positive=Good on a good/bad label (or 3 on a 1/2 label) trained to 'accuracy 1.0'."""
    with pytest.raises(ConfigError, match=message) as e:
        table.load(path=_credit(tmp_path, labels), label="class", positive=positive, sensitive="sex", preprocessing="empirical")
    assert "\n" not in str(e.value)
    ok = table.load(path=_credit(tmp_path, labels), label="class", positive=labels[1], sensitive="sex", preprocessing="empirical")
    assert 0 < ok.y.mean() < 1


def test_a_label_class_the_file_never_holds_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^dataset.options.levels.class lists the class 'Bad', which the label column never holds "
                                          r"\(its values: bad, good\)"):
        table.load(path=_credit(tmp_path), label="class", sensitive="sex", levels={"class": ["Bad", "Good"], "sex": ["F", "M"]},
                   bounds={"amount": [0, 1e4]}, types={"own": "drop"}, preprocessing="public")


def test_yaml_booleans_in_a_level_list_name_the_cause(tmp_path):
    """Why 5: unquoted [no, yes] became [False, True] and the error said '0 usable rows'."""
    from omegaconf import OmegaConf

    levels = OmegaConf.to_container(OmegaConf.create("{class: [bad, good], sex: [F, M], own: [no, yes]}"))
    assert levels["own"] == [False, True]
    with pytest.raises(ConfigError, match=r"^dataset.options.levels.own holds the booleans \[False, True\]: YAML reads unquoted no/yes"):
        table.load(path=_credit(tmp_path), label="class", sensitive="sex", levels=levels, bounds={"amount": [0, 1e4]}, preprocessing="public")
    with pytest.raises(ConfigError, match=r"^dataset.options.positive holds the booleans \[True\]"):
        table.load(path=_credit(tmp_path, ("no", "yes")), label="class", positive=True, sensitive="sex", preprocessing="empirical")
    ok = table.load(path=_credit(tmp_path), label="class", sensitive="sex", levels={**levels, "own": ["no", "yes"]},
                    bounds={"amount": [0, 1e4]}, preprocessing="public")
    assert "own=yes" in ok.feature_names


def test_too_few_usable_rows_say_which_rule_dropped_them(tmp_path):
    with pytest.raises(DataIntegrityError, match=r"0 of 80 rows are usable.*sensitive value not in its level list: 80"):
        table.load(path=_credit(tmp_path), label="class", sensitive="sex", levels={"class": ["bad", "good"], "sex": ["f", "m"]},
                   bounds={"amount": [0, 1e4]}, types={"own": "drop"}, preprocessing="public")


@pytest.mark.parametrize("sep", [";", "\t", "|"])
def test_the_delimiter_is_read_from_the_header_or_set(tmp_path, sep):
    """Why 5: a ';'-separated file gave "no such column id;age;sex;...\""""
    path = _credit(tmp_path, sep=sep)
    d = table.load(path=path, label="class", sensitive="sex", preprocessing="empirical")
    assert d.feature_names[0] == "amount" and len(d.y) == 80
    assert table.load(path=path, label="class", sensitive="sex", preprocessing="empirical", delimiter=sep).feature_names == d.feature_names
    if sep != ",":  # a wrong separator reads one column: the one the header uses is named
        with pytest.raises(DataIntegrityError, match=rf"reads as one column .* with the field separator ',', but its header line "
                                                     rf"separates its fields by {re.escape(repr(sep))}: set dataset.options.delimiter="):
            table.load(path=path, label="class", sensitive="sex", preprocessing="empirical", delimiter=",")
    with pytest.raises(ConfigError, match=r"^dataset.options.delimiter must be one character or null"):
        table.load(path=path, label="class", sensitive="sex", preprocessing="empirical", delimiter=";;")


def test_duplicate_headers_are_named(tmp_path, caplog):
    """Why 4: a header naming decile_score twice was silently read as decile_score.1."""
    path = tmp_path / "dup.csv"
    path.write_text("x,decile_score,s,t,decile_score\n" + "".join(f"{i},{i % 10},{'FM'[i % 2]},{'ab'[i % 3 % 2]},{i % 10}\n" for i in range(40)))
    with caplog.at_level("WARNING", logger="raco_cli"):
        d = table.load(path=str(path), label="t", sensitive="s", preprocessing="empirical")
    assert "decile_score.1" in d.feature_names
    assert any("names the column 'decile_score' 2 times (positions 2, 5); read as 'decile_score', 'decile_score.1'" in r.getMessage()
               for r in caplog.records)
