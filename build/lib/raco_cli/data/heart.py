"""Heart Disease Health Indicators (Kaggle, CDC BRFSS 2015): heart disease, sensitive Sex.

Source (facts from the mirror README ``shared/datasets/README.md``, section Heart): Kaggle
dataset ``alexteboul/heart-disease-health-indicators-dataset``, file
``heart_disease_health_indicators_BRFSS2015.csv`` (plain or .gz): 253 680 rows, 22 columns,
every value written as a float, no missing values; sha256 of the content ``953fb23b...``
(of the mirror copy; no upstream checksum is published).  Kaggle downloads need a login,
so raco does not download it: place the file by hand (see :data:`MANUAL`).

Definitions:

* label: ``HeartDiseaseorAttack`` = 1 (23 893 positives, 9.42 %);
* sensitive attribute (``dataset.options.sensitive``, default ``Sex``), grouped as in
  :data:`GROUPINGS`; codes of Age, Education and Income are those of the BRFSS 2015
  codebook (``_AGEG5YR``, ``EDUCA``, ``INCOME2``), the groupings are ours (a few groups of
  reasonable size, since RaCO-DP's utility depends on the smallest group); ``Diabetes``
  (0 none, 1 prediabetes, 2 diabetes) gives none vs. any.  Any 0/1 column of :data:`BINARY`
  (``HighBP``, ``Smoker``, ...) is accepted as a two-group attribute.
* features: the 21 columns other than the label, all standardised on the training part, as
  in the reference loader (which keeps ``Sex`` among the features);
  ``dataset.options.sensitive_as_feature=false`` drops the sensitive column (20 features).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from raco_cli.data import sources
from raco_cli.data.tabular import ColumnSpec, build_tabular, require_columns
from raco_cli.data.types import TabularData
from raco_cli.errors import CHOICE, TYPE, ConfigError, DataIntegrityError

FILE_NAME = "heart_disease_health_indicators_BRFSS2015.csv"
KAGGLE = "https://www.kaggle.com/datasets/alexteboul/heart-disease-health-indicators-dataset"
MANUAL = (
    f"Kaggle needs a login, so raco cannot download it: get it from {KAGGLE} (or run "
    "`kaggle datasets download -d alexteboul/heart-disease-health-indicators-dataset --unzip`) "
    f"and put {FILE_NAME} (gzip accepted) in datasets/heart/ or in $RACO_DATA_MIRROR/heart/"
)
FILES = (
    sources.RemoteFile(
        FILE_NAME,
        sha256="953fb23bb131736d7879539a071d3f6d1eaae8d4867ab05335d0ba89b94d5f99",
        manual_hint=MANUAL,
    ),
)
LABEL = "HeartDiseaseorAttack"
FEATURES = (
    "HighBP", "HighChol", "CholCheck", "BMI", "Smoker", "Stroke", "Diabetes", "PhysActivity",
    "Fruits", "Veggies", "HvyAlcoholConsump", "AnyHealthcare", "NoDocbcCost", "GenHlth",
    "MentHlth", "PhysHlth", "DiffWalk", "Sex", "Age", "Education", "Income",
)  # fmt: skip
N_ROWS = 253_680

# sensitive column -> ordered (group name, codes) pairs.
GROUPINGS: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {
    "Sex": (("Female", (0,)), ("Male", (1,))),
    # _AGEG5YR: 1 = 18-24, 2 = 25-29, ..., 5 = 40-44, 6 = 45-49, ..., 9 = 60-64, 10 = 65-69, ..., 13 = 80+
    "Age": (("18-44", (1, 2, 3, 4, 5)), ("45-64", (6, 7, 8, 9)), ("65+", (10, 11, 12, 13))),
    # EDUCA: 1 never attended, 2 grades 1-8, 3 grades 9-11, 4 grade 12 / GED, 5 college 1-3 y, 6 college 4+ y
    "Education": (("no college", (1, 2, 3, 4)), ("some college", (5,)), ("college graduate", (6,))),
    # INCOME2: 1 < $10k, 2 10-15k, 3 15-20k, 4 20-25k, 5 25-35k, 6 35-50k, 7 50-75k, 8 >= 75k
    "Income": (("<25k", (1, 2, 3, 4)), ("25-50k", (5, 6)), (">=50k", (7, 8))),
    # Diabetes (Kaggle description): 0 no diabetes, 1 prediabetes, 2 diabetes
    "Diabetes": (("no diabetes", (0,)), ("prediabetes or diabetes", (1, 2))),
}
# 0/1 columns of the file (checked on the mirror copy), usable as two-group attributes.
BINARY = (
    "HighBP", "HighChol", "CholCheck", "Smoker", "Stroke", "PhysActivity", "Fruits", "Veggies",
    "HvyAlcoholConsump", "AnyHealthcare", "NoDocbcCost", "DiffWalk",
)  # fmt: skip


def read_raw(*, data_dir: Path, mirror: str | None, allow_download: bool) -> tuple[pd.DataFrame, str]:
    """The raw table (253 680 rows, 22 columns) and the path it came from."""
    stream, path = sources.open_file(
        "heart", FILES[0], data_dir=data_dir, mirror=mirror, allow_download=allow_download
    )
    df = pd.read_csv(stream, dtype=np.float64)
    require_columns(df, (LABEL, *FEATURES), dataset="heart", path=str(path))
    if len(df) != N_ROWS:
        raise DataIntegrityError(f"{path} has {len(df)} rows, expected {N_ROWS}.")
    return df, str(path)


def grouping(column: object) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The (group name, codes) pairs of a sensitive column.

    Raises:
        ConfigError: the column has no grouping (not in :data:`GROUPINGS` or :data:`BINARY`).
    """
    if column in GROUPINGS:
        return GROUPINGS[str(column)]
    if column in BINARY:
        return ((f"{column}=0", (0,)), (f"{column}=1", (1,)))
    allowed = f"{', '.join(GROUPINGS)} or a 0/1 column ({', '.join(BINARY)})"
    raise ConfigError(
        CHOICE.format(key="dataset.options.sensitive", choices=allowed, value=column,
                      meaning="the column that defines the sensitive groups.")
    )


def sensitive_groups(df: pd.DataFrame, column: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Group index of every row and the group names for a sensitive column.

    Raises:
        ConfigError: the column has no grouping (not in :data:`GROUPINGS` or :data:`BINARY`).
    """
    spec = grouping(column)
    values = df[column].to_numpy()
    group = np.full(len(values), -1, dtype=np.int64)
    for g, (_, codes) in enumerate(spec):
        group[np.isin(values, codes)] = g
    if (group < 0).any():
        bad = sorted(set(values[group < 0].tolist()))[:5]
        raise DataIntegrityError(f"heart: column {column} has values {bad} outside its grouping.")
    return group, tuple(name for name, _ in spec)


def load(
    *,
    data_dir: Path,
    mirror: str | None = None,
    allow_download: bool = True,
    split_seed: int = 0, split: str = "stratified",
    sensitive: str = "Sex",
    sensitive_as_feature: bool = True,
    preprocessing: str = "empirical",
    bounds: Mapping[str, object] | None = None,
) -> TabularData:
    """Load Heart as :class:`TabularData` (label 1 = HeartDiseaseorAttack)."""
    if not isinstance(sensitive_as_feature, bool):
        raise ConfigError(
            TYPE.format(key="dataset.options.sensitive_as_feature", expected="true or false",
                        value=sensitive_as_feature, meaning="keep the sensitive column among the features.")
        )
    grouping(sensitive)  # reject a bad option before reading 22 MB
    df, source = read_raw(data_dir=data_dir, mirror=mirror, allow_download=allow_download)
    group, names = sensitive_groups(df, str(sensitive))
    features = tuple(c for c in FEATURES if sensitive_as_feature or c != sensitive)
    return build_tabular(
        "heart",
        df,
        y=(df[LABEL] == 1).to_numpy(dtype=np.int64),
        group=group,
        columns=ColumnSpec(numeric=features),
        class_names=("no heart disease", "heart disease or attack"),
        group_names=names,
        split_seed=split_seed,
        split=split,
        preprocessing=preprocessing,
        bounds=bounds,
        source=source,
        meta={"sensitive": sensitive, "label": LABEL, "sensitive_as_feature": sensitive_as_feature},
    )
