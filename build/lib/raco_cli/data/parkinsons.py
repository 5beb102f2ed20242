"""UCI Parkinsons Telemonitoring (Tsanas & Little 2009): high total UPDRS, sensitive sex.

Source (facts from the mirror README ``shared/datasets/README.md``, section Parkinsons): the raw
UCI file ``parkinsons_updrs.data`` (plain or .gz), CSV with a header, 5 875 rows, 22 columns
``subject#, age, sex, test_time, motor_UPDRS, total_UPDRS`` and 16 voice measures; sha256 of
the content ``f2c7d502...``; sex 0 = male (4 008 rows), 1 = female (1 867).

Definitions:

* features: the 19 columns other than ``subject#``, ``total_UPDRS`` and ``sex``, all
  standardised on the training part (the reference ``num_inp_attr = 19``).  ``motor_UPDRS``
  (the motor part of the total score, so strongly predictive) is a feature in the reference
  setup; ``dataset.options.include_motor_updrs=false`` drops it (18 features).
* sensitive attribute: sex, group 0 ``Male``, 1 ``Female``; not a feature.
* label: ``dataset.preprocessing=empirical`` (``privacy.scope=paper``): ``total_UPDRS >
  median`` where the median is taken over the **training part** only (no test row enters a
  training statistic).  ``public`` (``scope=model``): ``total_UPDRS > 27.576``, the fixed
  threshold of the reference file (its full-data median), used for the split's strata too;
  features then scaled with the public bounds of ``conf/dataset/parkinsons.yaml``.

Split: stratification needs a label before the split exists.  We stratify on
(provisional label, sex), the provisional label being ``total_UPDRS >`` the full-data median,
and only then define the label with the training median.  The two medians are close, so
the classes stay balanced in every split; the full-data median is used for nothing else
(like any stratified split, the split reads every row's stratum; the label threshold and
the standardisation read the training part only, which a test checks by perturbing the
test rows).
Rows of one subject may fall in different splits, as in the reference protocol (it splits
rows, not subjects).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from raco_cli.data import sources
from raco_cli.data.tabular import ColumnSpec, build_tabular, require_columns, split_rows
from raco_cli.data.types import TabularData
from raco_cli.errors import DataIntegrityError

log = logging.getLogger(__name__)

UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases/parkinsons/telemonitoring/"
FILES = (
    sources.RemoteFile(
        "parkinsons_updrs.data",
        urls=(UCI + "parkinsons_updrs.data",),
        sha256="f2c7d5025dec4e92e7feae367a5f7ccf58789a10ac6b54bdf15976c599f9dd39",
    ),
)
VOICE = (
    "Jitter(%)", "Jitter(Abs)", "Jitter:RAP", "Jitter:PPQ5", "Jitter:DDP",
    "Shimmer", "Shimmer(dB)", "Shimmer:APQ3", "Shimmer:APQ5", "Shimmer:APQ11", "Shimmer:DDA",
    "NHR", "HNR", "RPDE", "DFA", "PPE",
)  # fmt: skip
COLUMNS = ("subject#", "age", "sex", "test_time", "motor_UPDRS", "total_UPDRS", *VOICE)
GROUPS = ("Male", "Female")
N_ROWS = 5_875


def read_raw(*, data_dir: Path, mirror: str | None, allow_download: bool) -> tuple[pd.DataFrame, str]:
    """The raw table (5 875 rows, 22 columns) and the path it came from."""
    stream, path = sources.open_file(
        "parkinsons", FILES[0], data_dir=data_dir, mirror=mirror, allow_download=allow_download
    )
    df = pd.read_csv(stream)
    require_columns(df, COLUMNS, dataset="parkinsons", path=str(path))
    if len(df) != N_ROWS:
        raise DataIntegrityError(f"{path} has {len(df)} rows, expected {N_ROWS}.")
    return df, str(path)


# dataset.preprocessing=public: the label threshold is the published constant of the reference
# preprocessing (its processed file thresholds total_UPDRS at 27.576, the median of the UCI
# release): a fixed task definition, not a statistic of the training part.
PUBLIC_THRESHOLD = 27.576


def feature_columns(include_motor_updrs: bool = True) -> tuple[str, ...]:
    """The feature columns in file order (19, or 18 without motor_UPDRS)."""
    drop = {"subject#", "sex", "total_UPDRS"} | (set() if include_motor_updrs else {"motor_UPDRS"})
    return tuple(c for c in COLUMNS if c not in drop)


def load(
    *,
    data_dir: Path,
    mirror: str | None = None,
    allow_download: bool = True,
    split_seed: int = 0,
    split: str = "stratified",
    include_motor_updrs: bool = True,
    preprocessing: str = "empirical",
    bounds: Mapping[str, object] | None = None,
) -> TabularData:
    """Load Parkinsons as :class:`TabularData` (label 1 = total_UPDRS > training median)."""
    if not isinstance(include_motor_updrs, bool):
        from raco_cli.errors import TYPE, ConfigError

        raise ConfigError(
            TYPE.format(
                key="dataset.options.include_motor_updrs", expected="true or false",
                value=include_motor_updrs, meaning="keep motor_UPDRS among the features.",
            )
        )
    df, source = read_raw(data_dir=data_dir, mirror=mirror, allow_download=allow_download)
    total = df["total_UPDRS"].to_numpy(dtype=np.float64)
    group = (df["sex"] == 1).to_numpy(dtype=np.int64)
    if preprocessing == "public":
        # a fixed, published task definition (not a statistic of the rows being trained on):
        # the same value stratifies the split and defines the label
        threshold, how = PUBLIC_THRESHOLD, "public task threshold"
        y = (total > threshold).astype(np.int64)
        splits = split_rows(y, group, seed=split_seed, how=split, frame=df)
    else:
        provisional = (total > np.median(total)).astype(np.int64)  # stratification only
        splits = split_rows(provisional, group, seed=split_seed, how=split, frame=df)
        threshold, how = float(np.median(total[splits["train"]])), "training median"
        y = (total > threshold).astype(np.int64)
        log.info("parkinsons: label total_UPDRS > %.4f (median of the training part)", threshold)
    return build_tabular(
        "parkinsons",
        df,
        y=y,
        group=group,
        columns=ColumnSpec(numeric=feature_columns(include_motor_updrs)),
        class_names=("low UPDRS", "high UPDRS"),
        group_names=GROUPS,
        split_seed=split_seed,
        preprocessing=preprocessing,
        bounds=bounds,
        source=source,
        splits=splits,
        meta={
            "sensitive": "sex",
            "label": f"total_UPDRS>{threshold:.4f} ({how})",
            "label_threshold": threshold,
            "include_motor_updrs": include_motor_updrs,
        },
    )
