"""The Credit loader: xls and CSV forms, definitions, 85 features, checksums, missing file."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raco_cli.data import credit
from raco_cli.errors import DataIntegrityError, DataNotFoundError


def mirror_csv(folder: Path) -> bytes:
    """The mirror's table (``mirror_dir("credit")``), uncompressed."""
    return gzip.decompress((folder / "UCI_Credit_Card.csv.gz").read_bytes())


def make_xls(df: pd.DataFrame) -> bytes:
    """An .xls laid out like the UCI file: row 1 ``'', X1..X23, Y``, row 2 the names."""
    import xlwt

    wb = xlwt.Workbook()
    ws = wb.add_sheet("Data")
    second = [*credit.COLUMNS[:-1], "default payment next month"]
    for j, (first, name) in enumerate(zip(credit.CSV_COLUMNS, second)):
        ws.write(0, j, "" if j == 0 else first)
        ws.write(1, j, name)
    for i, row in enumerate(df[list(credit.COLUMNS)].to_numpy().tolist()):
        for j, v in enumerate(row):
            ws.write(i + 2, j, v)
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def small_table(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.integers(0, 5, size=(n, len(credit.COLUMNS))), columns=list(credit.COLUMNS))
    df["ID"] = np.arange(1, n + 1)
    return df


def test_xls_is_parsed_to_the_canonical_table_and_checked():
    df = small_table()
    parsed = credit.parse_xls(make_xls(df))
    assert list(parsed.columns) == list(credit.COLUMNS)
    assert (parsed.to_numpy() == df.to_numpy()).all()
    with pytest.raises(DataIntegrityError, match=r"Content mismatch for default of credit card clients.xls: expected table sha256 7d0c12ad"):
        credit._check_xls(make_xls(df))  # not the UCI table


def test_truncated_xls_is_rejected():
    content = make_xls(small_table(400))
    with pytest.raises(DataIntegrityError) as info:
        credit.parse_xls(content[: len(content) // 2])
    assert str(info.value).startswith("Cannot read default of credit card clients.xls: ")
    assert str(info.value).endswith("The file is truncated or corrupted; delete it and fetch it again with: make data DATASET=credit")


def test_kaggle_header_is_rejected():
    with pytest.raises(DataIntegrityError, match="Kaggle's file of the same name"):
        credit.parse_csv(b"ID,LIMIT_BAL,SEX\n1,2,3\n")


def test_missing_file_names_the_fetch_command(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        credit.load(data_dir=tmp_path, mirror=None, allow_download=False)
    assert str(info.value) == (
        f"Missing data file {tmp_path / 'credit' / 'default of credit card clients.xls'}. "
        "Download it with: make data DATASET=credit"
    )


@pytest.fixture(scope="module")
def data_credit(data_sources):
    data_dir, mirror = data_sources
    return credit.load(data_dir=data_dir, mirror=mirror, allow_download=False)


@pytest.mark.data("credit")
def test_definitions(data_credit, mirror_dir):
    d = data_credit
    assert d.X.shape == (30_000, 85) and d.n_features == 85
    assert int(d.y.sum()) == 6_636  # defaults (22.12 %)
    assert int((d.group == 1).sum()) == 18_112 and d.group_names == ("Male", "Female")
    assert not any(n.startswith("SEX") or n == "ID" for n in d.feature_names)
    raw = credit.parse_csv(mirror_csv(mirror_dir("credit")))
    # EDUCATION 0/5/6 collapse into 'others' (4); MARRIAGE 0 into 3
    edu4 = d.X[:, d.feature_names.index("EDUCATION=4")]
    assert int(edu4.sum()) == int(raw["EDUCATION"].isin([0, 4, 5, 6]).sum())
    mar3 = d.X[:, d.feature_names.index("MARRIAGE=3")]
    assert int(mar3.sum()) == int(raw["MARRIAGE"].isin([0, 3]).sum())
    for col in ("EDUCATION", "MARRIAGE", *(f"PAY_{i}" for i in (0, 2, 3, 4, 5, 6))):
        block = [i for i, n in enumerate(d.feature_names) if n.startswith(col + "=")]
        np.testing.assert_array_equal(d.X[:, block].sum(1), 1.0)  # every row has exactly one level


@pytest.mark.data("credit")
def test_split_and_train_only_statistics(data_credit):
    d = data_credit
    n = len(d.y)
    assert len(d.splits["test"]) == pytest.approx(0.25 * n, abs=2)
    for ix in d.splits.values():
        for y in (0, 1):
            for g in (0, 1):
                assert np.mean((d.y[ix] == y) & (d.group[ix] == g)) == pytest.approx(np.mean((d.y == y) & (d.group == g)), abs=0.003)
    numeric = [d.feature_names.index(c) for c in credit.NUMERIC]
    train = d.X[d.splits["train"]][:, numeric]
    np.testing.assert_allclose(train.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(train.std(0), 1.0, atol=1e-3)


@pytest.mark.data("credit")
def test_truncated_csv_fails_its_checksum(tmp_path, mirror_dir):
    content = mirror_csv(mirror_dir("credit"))
    (tmp_path / "credit").mkdir()
    (tmp_path / "credit" / "UCI_Credit_Card.csv").write_bytes(content[: len(content) - 1000])
    with pytest.raises(DataIntegrityError, match=r"Checksum mismatch for .*UCI_Credit_Card\.csv: expected sha256 023eb2c3ad9e"):
        credit.load(data_dir=tmp_path, mirror=None, allow_download=False)


@pytest.mark.data("credit")
@pytest.mark.slow
def test_full_xls_gives_the_same_table(tmp_path, mirror_dir):
    """The upstream form: an .xls of the mirror table passes the table digest (~15 s)."""
    (tmp_path / "credit").mkdir()
    (tmp_path / "credit" / credit.XLS_NAME).write_bytes(make_xls(credit.parse_csv(mirror_csv(mirror_dir("credit")))))
    d = credit.load(data_dir=tmp_path, mirror=None, allow_download=False)
    assert d.source.endswith(".xls") and d.X.shape == (30_000, 85)
