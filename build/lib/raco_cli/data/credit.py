"""UCI Default of Credit Card Clients (Yeh 2009): default next month, sensitive attribute sex.

Sources (facts from the mirror README ``shared/datasets/README.md``, section Credit):

* upstream: the UCI ``.xls`` (``default of credit card clients.xls``, two header rows: the
  first ``ID, X1..X23, Y``, the second the column names below).  Its bytes have no
  published checksum, so it is verified by :data:`TABLE_SHA256`, a digest of the parsed
  30 000 x 25 integer table, identical for both forms.  Reading it needs ``xlrd``
  (a runtime dependency of raco).
* alternative: ``UCI_Credit_Card.csv`` (plain or .gz), the CSV conversion of the xls with
  header ``ID,X1,...,X23,Y``, CRLF line endings, integer values; sha256 of the content
  ``023eb2c3...``.  Not Kaggle's file of the same name (other header, float values).

Definitions:

* label: ``default payment next month`` (Y) = 1 (6 636 of 30 000, 22.12 %);
* sensitive attribute: SEX (X2), 1 = male -> group 0 ``Male`` (11 888), 2 = female -> group 1
  ``Female`` (18 112); not a feature;
* 14 numeric columns standardised on the training part: LIMIT_BAL, AGE, BILL_AMT1-6,
  PAY_AMT1-6 (the reference ``cols_to_norm``);
* one-hot columns over fixed vocabularies (85 features in total, the reference
  ``num_inp_attr``):

  - EDUCATION: 1 graduate school, 2 university, 3 high school, 4 others; the undocumented
    codes 0, 5, 6 are collapsed into 4 ``others`` (4 levels);
  - MARRIAGE: 1 married, 2 single, 3 others; the undocumented 0 is collapsed into 3 (3 levels);
  - PAY_0, PAY_2, PAY_3, PAY_4: -2..8 (11 levels); PAY_5, PAY_6: -2, 0, 2..8 (10 levels; the
    value 1 never occurs in these two columns of the published data).  The vocabularies are
    fixed (not read from the training part), so the encoding never depends on the split.
    This is the only level handling that reaches the reference's 85 features.
* ID is dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from raco_cli.data import sources
from raco_cli.data.tabular import ColumnSpec, build_tabular
from raco_cli.data.types import TabularData
from raco_cli.errors import DataIntegrityError

# Canonical column names (the xls's second header row; "default payment next month" -> default).
COLUMNS = (
    "ID", "LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE",
    "PAY_0", "PAY_2", "PAY_3", "PAY_4", "PAY_5", "PAY_6",
    "BILL_AMT1", "BILL_AMT2", "BILL_AMT3", "BILL_AMT4", "BILL_AMT5", "BILL_AMT6",
    "PAY_AMT1", "PAY_AMT2", "PAY_AMT3", "PAY_AMT4", "PAY_AMT5", "PAY_AMT6",
    "default",
)  # fmt: skip
CSV_COLUMNS = ("ID", *(f"X{i}" for i in range(1, 24)), "Y")  # the xls's first header row
NUMERIC = (
    "LIMIT_BAL", "AGE", *(f"BILL_AMT{i}" for i in range(1, 7)), *(f"PAY_AMT{i}" for i in range(1, 7)),
)  # fmt: skip
PAY_LEVELS = tuple(range(-2, 9))
VOCAB: dict[str, tuple[int, ...]] = {
    "EDUCATION": (1, 2, 3, 4),
    "MARRIAGE": (1, 2, 3),
    "PAY_0": PAY_LEVELS,
    "PAY_2": PAY_LEVELS,
    "PAY_3": PAY_LEVELS,
    "PAY_4": PAY_LEVELS,
    "PAY_5": tuple(v for v in PAY_LEVELS if v != 1),
    "PAY_6": tuple(v for v in PAY_LEVELS if v != 1),
}
GROUPS = ("Male", "Female")
N_ROWS = 30_000

# sha256 of the parsed table: int64 little-endian, C order, columns in COLUMNS order, rows in
# file order.  Computed from the mirror's UCI_Credit_Card.csv (itself verified by its sha256).
TABLE_SHA256 = "7d0c12ad5a87c1ba4b09d18a85664be31614e173fe5fb6feca9bfb568e3f6749"

XLS_NAME = "default of credit card clients.xls"
UCI_XLS = (
    "https://archive.ics.uci.edu/ml/machine-learning-databases/00350/"
    "default%20of%20credit%20card%20clients.xls"
)


def table_digest(df: pd.DataFrame) -> str:
    """sha256 of the canonical integer table (see :data:`TABLE_SHA256`)."""
    values = np.ascontiguousarray(df[list(COLUMNS)].to_numpy(dtype="<i8"))
    return hashlib.sha256(values.tobytes()).hexdigest()


def parse_csv(content: bytes) -> pd.DataFrame:
    """The mirror CSV (header ``ID,X1..X23,Y``) as a canonical table."""
    import io

    df = pd.read_csv(io.BytesIO(content))
    if tuple(df.columns) != CSV_COLUMNS:
        raise DataIntegrityError(
            f"UCI_Credit_Card.csv has header {tuple(df.columns)[:4]}..., expected ID,X1,...,X23,Y "
            "(Kaggle's file of the same name has another header and is not supported)."
        )
    df.columns = list(COLUMNS)
    return _integers(df, "UCI_Credit_Card.csv")


def parse_xls(content: bytes) -> pd.DataFrame:
    """The upstream .xls (names in the second header row) as a canonical table.

    Raises:
        DataIntegrityError: xlrd cannot read it (truncated / corrupted) or the columns differ.
    """
    import io

    try:
        # xlrd writes warnings about damaged files to its logfile (stdout by default)
        df = pd.read_excel(
            io.BytesIO(content), header=1, engine="xlrd", engine_kwargs={"logfile": io.StringIO()}
        )
    except ImportError as exc:
        raise DataIntegrityError(
            f"Reading {XLS_NAME} needs xlrd ({exc}); install it with: pip install 'xlrd>=2'"
        ) from exc
    except Exception as exc:  # xlrd raises its own XLRDError / struct errors on bad bytes
        raise DataIntegrityError(
            f"Cannot read {XLS_NAME}: {type(exc).__name__}: {exc}. The file is truncated or "
            f"corrupted; delete it and fetch it again with: {sources.fetch_command('credit')}"
        ) from exc
    df = df.rename(columns={"default payment next month": "default"})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise DataIntegrityError(f"{XLS_NAME} lacks the columns {missing}; it is not the UCI file.")
    return _integers(df[list(COLUMNS)], XLS_NAME)


def _integers(df: pd.DataFrame, what: str) -> pd.DataFrame:
    """Cast every column to int64 (the CSV writes some amounts as ``5.00E+05``)."""
    values = df.to_numpy(dtype=np.float64)
    if not np.isfinite(values).all() or (np.mod(values, 1) != 0).any():
        raise DataIntegrityError(f"{what}: every value must be an integer; the file is corrupted.")
    return pd.DataFrame(values.astype(np.int64), columns=df.columns)


def _check_table(df: pd.DataFrame, what: str) -> None:
    digest = table_digest(df)
    if digest != TABLE_SHA256:
        raise DataIntegrityError(
            f"Content mismatch for {what}: expected table sha256 {TABLE_SHA256}, got {digest}. "
            "The file is corrupted, truncated or a different version; delete it and fetch it "
            f"again with: {sources.fetch_command('credit')}"
        )


def _check_xls(content: bytes) -> None:
    _check_table(parse_xls(content), XLS_NAME)


CSV_FILE = sources.RemoteFile(
    "UCI_Credit_Card.csv",
    sha256="023eb2c3ad9efd15e7869616fa50a0143f25223105c7069ba632431530afdb61",
)
FILES = (
    sources.RemoteFile(XLS_NAME, urls=(UCI_XLS,), check=_check_xls, alternatives=(CSV_FILE,)),
)


def read_raw(*, data_dir: Path, mirror: str | None, allow_download: bool) -> tuple[pd.DataFrame, str]:
    """The canonical credit table (30 000 rows, :data:`COLUMNS`) and the path it came from."""
    form, stream, path = sources.open_any(
        "credit", FILES[0], data_dir=data_dir, mirror=mirror, allow_download=allow_download
    )
    content = stream.getvalue()
    df = parse_xls(content) if form.name == XLS_NAME else parse_csv(content)
    if len(df) != N_ROWS:
        raise DataIntegrityError(f"{path} has {len(df)} rows, expected {N_ROWS}.")
    return df, str(path)


def load(
    *, data_dir: Path, mirror: str | None = None, allow_download: bool = True, split_seed: int = 0, split: str = "stratified", preprocessing: str = "empirical", bounds: Mapping[str, object] | None = None
) -> TabularData:
    """Load Credit as :class:`TabularData` (label 1 = default, group 0 = Male, 1 = Female)."""
    df, source = read_raw(data_dir=data_dir, mirror=mirror, allow_download=allow_download)
    df = df.copy()
    df["EDUCATION"] = df["EDUCATION"].where(df["EDUCATION"].isin((1, 2, 3, 4)), 4)
    df["MARRIAGE"] = df["MARRIAGE"].where(df["MARRIAGE"].isin((1, 2, 3)), 3)
    y = (df["default"] == 1).to_numpy(dtype=np.int64)
    group = (df["SEX"] == 2).to_numpy(dtype=np.int64)
    return build_tabular(
        "credit",
        df,
        y=y,
        group=group,
        columns=ColumnSpec(numeric=NUMERIC, categorical=VOCAB),
        class_names=("no default", "default"),
        group_names=GROUPS,
        split_seed=split_seed,
        split=split,
        preprocessing=preprocessing,
        bounds=bounds,
        source=source,
        meta={"sensitive": "SEX", "label": "default payment next month"},
    )
