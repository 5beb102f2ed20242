"""UCI Adult (Becker & Kohavi 1996): income > 50K, sensitive attribute sex.

Reads the raw UCI files ``adult.data`` and ``adult.test`` (plain or gzip), drops every row
with a missing value ('?'), and pools both files (45 222 rows, as ``adult.names`` states)
before the shared split protocol.  ``sex`` is the sensitive attribute and not a feature.
The 102 features are 6 standardised numeric columns and the one-hot encoding of the 7
categorical columns over their public vocabularies (from ``adult.names``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from raco_cli.data import sources
from raco_cli.data.tabular import ColumnSpec, build_tabular, require_columns
from raco_cli.data.types import TabularData
from raco_cli.errors import DataIntegrityError

UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
FILES = (
    sources.RemoteFile(
        "adult.data",
        urls=(UCI + "adult.data",),
        sha256="5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    ),
    sources.RemoteFile(
        "adult.test",
        urls=(UCI + "adult.test",),
        sha256="a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    ),
)

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
)  # fmt: skip
NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")

# Vocabularies transcribed from adult.names (public schema).  'Never-worked' is left out of
# workclass: every such row has occupation '?', so none survives the missing-value filter.
VOCAB: dict[str, tuple[str, ...]] = {
    "workclass": (
        "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
        "Without-pay",
    ),
    "education": (
        "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc",
        "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool",
    ),
    "marital-status": (
        "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
        "Married-spouse-absent", "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
        "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
        "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv", "Armed-Forces",
    ),
    "relationship": (
        "Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried",
    ),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran",
        "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal",
        "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
        "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
        "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
    ),
}  # fmt: skip
GROUPS = ("Male", "Female")


def read_raw(*, data_dir: Path, mirror: str | None, allow_download: bool) -> tuple[pd.DataFrame, str]:
    """The cleaned, pooled Adult table (45 222 rows) and a description of its source."""
    frames, paths = [], []
    for spec, skip in zip(FILES, (0, 1)):  # adult.test starts with '|1x3 Cross validator'
        stream, path = sources.open_file(
            "adult", spec, data_dir=data_dir, mirror=mirror, allow_download=allow_download
        )
        try:
            df = pd.read_csv(
                stream,
                header=None,
                names=list(COLUMNS),
                skipinitialspace=True,
                na_values="?",
                skiprows=skip,
                dtype=str,
            )
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataIntegrityError(
                f"{path} is not a valid 'adult' file ({first}). Delete it and fetch it again with: make data DATASET=adult"
            ) from None
        if df.empty:
            raise DataIntegrityError(
                f"{path} is not a valid 'adult' file (it has no rows). Delete it and fetch it again with: make data DATASET=adult"
            )
        require_columns(df, COLUMNS, dataset="adult", path=str(path))
        _check_shape(df, str(path))
        frames.append(df)
        paths.append(str(path))
    df = pd.concat(frames, ignore_index=True).dropna().reset_index(drop=True)
    for col in NUMERIC:
        values = pd.to_numeric(df[col], errors="coerce")
        if values.isna().any():
            bad = df.loc[values.isna(), col].iloc[0]
            raise DataIntegrityError(
                f"Adult column '{col}' has a non-numeric value {bad!r}; the file is not a valid UCI Adult "
                "file. Delete it and fetch it again with: make data DATASET=adult"
            )
        df[col] = values
    df["income"] = df["income"].str.rstrip(".")
    if df.empty:
        raise DataIntegrityError(f"No complete rows in {', '.join(paths)}. Delete the files and fetch them again with: make data DATASET=adult")
    return df, ", ".join(paths)


def _check_shape(df: pd.DataFrame, path: str) -> None:
    """Wrong columns (a different or damaged table) fail here with one line, not later.

    pandas pads short lines with NaN and ``names=`` hides extra columns, so the column
    names alone prove nothing: every non-blank line must fill the label column with a
    known value.
    """
    labels = df["income"].dropna().str.rstrip(".")
    unknown = sorted(set(labels) - {"<=50K", ">50K"})
    if df["income"].isna().any() or unknown:
        detail = f"unexpected labels {unknown[:3]}" if unknown else "lines with fewer than 15 columns"
        raise DataIntegrityError(
            f"{path} is not a valid 'adult' file ({detail}); expected 15 comma-separated columns ending in "
            "the income label. Delete it and fetch it again with: make data DATASET=adult"
        )


def load(
    *, data_dir: Path, mirror: str | None = None, allow_download: bool = True, split_seed: int = 0, split: str = "stratified", preprocessing: str = "empirical", bounds: Mapping[str, object] | None = None
) -> TabularData:
    """Load Adult as :class:`TabularData` (label 1 = income >50K, group 0 = Male, 1 = Female)."""
    df, source = read_raw(data_dir=data_dir, mirror=mirror, allow_download=allow_download)
    y = (df["income"] == ">50K").to_numpy(dtype=np.int64)
    group = (df["sex"] == "Female").to_numpy(dtype=np.int64)
    return build_tabular(
        "adult",
        df,
        y=y,
        group=group,
        columns=ColumnSpec(numeric=NUMERIC, categorical=VOCAB),
        class_names=("<=50K", ">50K"),
        group_names=GROUPS,
        split_seed=split_seed,
        split=split,
        preprocessing=preprocessing,
        bounds=bounds,
        source=source,
        meta={"sensitive": "sex", "label": "income>50K"},
    )
