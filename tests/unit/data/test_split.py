"""The per-record split (``dataset.split=record``, the default under ``privacy.scope=model``):
each row's split is a keyed hash of its own cells, so adding or removing one row of a file moves
no other row, whatever the row (its label, group, types, extreme values); the shared protocol's
proportions in expectation; the paper's stratified shuffle under ``scope=paper``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raco_cli.data.tabular import record_split, row_hashes, split_rows
from raco_cli.errors import ConfigError


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "age": rng.integers(18, 90, n), "income": rng.lognormal(10, 1, n), "city": rng.choice(["Paris", "Lyon", "Nice"], n),
        "flag": np.where(rng.random(n) < 0.01, "y", "x"), "label": rng.integers(0, 2, n), "group": rng.choice(["F", "M"], n),
    })  # fmt: skip


def _assignment(frame: pd.DataFrame, seed: int = 0) -> dict[int, str]:
    """row position -> its split name."""
    y = np.zeros(len(frame), dtype=np.int64)
    splits = split_rows(y, y, seed=seed, how="record", frame=frame)
    return {int(i): name for name, rows in splits.items() for i in rows}


@settings(max_examples=25, deadline=None)
@given(n=st.integers(60, 400), drop=st.integers(0, 10**6), seed=st.integers(0, 2**32 - 1))
def test_removing_any_row_moves_no_other_row(n, drop, seed):
    frame = _frame(n, seed=seed % 1000)
    full = _assignment(frame, seed)
    k = drop % n
    smaller = _assignment(frame.drop(index=k).reset_index(drop=True), seed)
    assert [full[i] for i in range(n) if i != k] == [smaller[j] for j in range(n - 1)]


@pytest.mark.parametrize("neighbour", ["label 1", "group F", "huge value", "only row with flag y", "a word in a numeric column",
                                       "a missing cell", "a duplicate of row 3"])
def test_adding_a_row_of_any_kind_moves_no_other_row(neighbour):
    """The rows a reviewer would try: each class and group, an extreme value, the one row that
    makes a column take two values, text in a numeric column (pandas then reads the whole column
    as text), a missing cell (the column then reads as floats), a duplicate."""
    frame = _frame(300)
    row = frame.iloc[[3]].copy()
    if neighbour == "label 1":
        row["label"] = 1
    elif neighbour == "group F":
        row["group"] = "F"
    elif neighbour == "huge value":
        row["income"] = 1e300
    elif neighbour == "only row with flag y":
        frame["flag"] = "x"
        row["flag"] = "y"
    elif neighbour == "a word in a numeric column":
        row = row.astype({"age": object})
        row["age"] = "unknown"
    elif neighbour == "a missing cell":
        row = row.astype({"age": float})
        row["age"] = np.nan
    bigger = pd.concat([frame, row], ignore_index=True)
    before, after = _assignment(frame), _assignment(bigger)
    assert [before[i] for i in range(len(frame))] == [after[i] for i in range(len(frame))]
    if neighbour == "a duplicate of row 3":
        assert after[len(frame)] == after[3]  # a row's split is its content's


def test_a_cell_counts_by_its_value_not_by_its_columns_type():
    typed = pd.DataFrame({"a": [39, 40, 41], "b": ["x", "y", " z "]})
    text = pd.DataFrame({"a": ["39", "40.0", "41"], "b": ["x", "y", "z"]})
    floats = pd.DataFrame({"a": [39.0, 40.0, 41.0], "b": ["x", "y", "z"]})
    assert np.array_equal(row_hashes(typed, seed=0), row_hashes(text, seed=0))
    assert np.array_equal(row_hashes(typed, seed=0), row_hashes(floats, seed=0))
    assert not np.array_equal(row_hashes(typed, seed=0), row_hashes(typed, seed=1))  # keyed by dataset.split_seed
    swapped = pd.DataFrame({"b": ["x", "y", "z"], "a": [39, 40, 41]})
    assert not np.array_equal(row_hashes(typed, seed=0), row_hashes(swapped, seed=0))  # the columns count in order


def test_the_proportions_are_the_shared_protocols_in_expectation():
    splits = split_rows(np.zeros(40_000, dtype=np.int64), np.zeros(40_000, dtype=np.int64), seed=0, how="record", frame=_frame(40_000))
    shares = {k: len(v) / 40_000 for k, v in splits.items()}
    assert shares["test"] == pytest.approx(0.25, abs=0.01) and shares["val"] == pytest.approx(0.75 * 0.15, abs=0.01)
    assert sorted(np.concatenate(list(splits.values())).tolist()) == list(range(40_000))


def test_too_small_a_table_is_refused_in_one_line():
    from raco_cli.errors import DataIntegrityError

    with pytest.raises(DataIntegrityError, match="at least 20"):
        record_split(np.arange(10, dtype=np.uint64))


def test_the_paper_scope_keeps_the_stratified_shuffle():
    from raco_cli.data.tabular import stratified_split

    rng = np.random.default_rng(0)
    y, g = rng.integers(0, 2, 500), rng.integers(0, 2, 500)
    same = split_rows(y, g, seed=3, how="stratified")
    want = stratified_split(y, g, seed=3)
    assert all(np.array_equal(same[k], want[k]) for k in want)


def test_the_scope_decides_the_split_of_every_dataset(composer):
    from raco_cli.run.spec import build_run_spec

    assert build_run_spec(composer(["dataset=adult", "tracking=none"])).dataset.split == "record"
    assert build_run_spec(composer(["dataset=adult", "tracking=none", "privacy.scope=paper"])).dataset.split == "stratified"
    assert build_run_spec(composer(["dataset=adult", "tracking=none", "dataset.split=record",
                                    "privacy.scope=paper"])).dataset.split == "record"
    with pytest.raises(ConfigError, match=r"dataset.split=stratified.*refused under privacy.scope=model") as err:
        build_run_spec(composer(["dataset=adult", "tracking=none", "dataset.split=stratified"]))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="dataset.split.*auto, record, stratified"):
        build_run_spec(composer(["dataset=adult", "tracking=none", "dataset.split=random"]))


def test_a_table_read_from_a_file_and_the_file_minus_a_row(tmp_path):
    """dataset=table: the neighbouring *file* (one line deleted) splits every other record as
    the file does."""
    from raco_cli.data import table

    frame = _frame(400)
    frame.to_csv(tmp_path / "full.csv", index=False)
    frame.drop(index=57).to_csv(tmp_path / "minus.csv", index=False)
    kw = dict(label="label", sensitive=["group"], levels={"label": [0, 1], "group": ["F", "M"], "city": ["Paris", "Lyon", "Nice"],
                                                           "flag": ["x", "y"]},
              split="record", preprocessing="empirical")
    full = table.load(path=str(tmp_path / "full.csv"), **kw)
    minus = table.load(path=str(tmp_path / "minus.csv"), **kw)
    where_full = {int(i): k for k, rows in full.splits.items() for i in rows}
    where_minus = {int(i): k for k, rows in minus.splits.items() for i in rows}
    assert [where_full[i] for i in range(400) if i != 57] == [where_minus[j] for j in range(399)]


@pytest.mark.parametrize("labels", ["configured", "private"])
def test_a_row_with_a_new_label_value_moves_no_other_row(tmp_path, labels):
    """The label counts in a row's hash as its configured class name (Adult read through
    dataset=table splits as dataset=adult), but while the label's levels are still to be
    estimated the interim classes are indices into every value of the file: a neighbour whose
    label is a value no other row holds ('fair', sorted between 'bad' and 'good') would shift
    them, and every row's hash with them, if they were hashed."""
    from raco_cli.data import table

    frame = _frame(400).assign(label=lambda f: np.where(f["label"] == 1, "good", "bad"))
    frame.to_csv(tmp_path / "file.csv", index=False)
    plus = pd.concat([frame, frame.iloc[[3]].assign(label="fair")], ignore_index=True)
    plus.to_csv(tmp_path / "plus.csv", index=False)
    levels = {"group": ["F", "M"], "city": ["Paris", "Lyon", "Nice"], "flag": ["x", "y"]}
    if labels == "configured":  # the new value is outside the configured classes: its row is dropped
        levels["label"] = ["bad", "good"]
    kw = dict(label="label", sensitive=["group"], levels=levels, split="record", preprocessing="public",
              bounds={"age": [0, 120], "income": [0, 1e7]})
    if labels == "private":
        kw["levels"] = {**levels, "label": "private"}
    where = [{int(r): k for k, rows in data.splits.items() for r in data.meta["file_rows"][rows]}
             for data in (table.load(path=str(tmp_path / f), **kw) for f in ("file.csv", "plus.csv"))]
    assert all(where[1][r] == split for r, split in where[0].items())
