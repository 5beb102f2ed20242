"""Split protocol and preprocessing shared by every tabular dataset (paper Section 6, App. E.1).

1. Split: 25 % test, then 15 % of the rest validation, stratified by label x group, with a
   fixed split seed (the same rows every run, whatever the training seed).
2. Preprocess (``dataset.preprocessing``):

   * ``public`` (the default under ``privacy.scope=model``): each numeric column clipped to
     public bounds declared in ``conf/dataset/<name>.yaml`` (with their documented source),
     optionally through a fixed transform (``log1p`` for heavy tails, ``slog1p`` for signed
     amounts, ``log`` for small positive ratios), and mapped affinely onto [-1, 1].  No statistic of the data is used, so the
     encoding of a row does not depend on any other row.
   * ``empirical`` (``scope=paper``): numeric columns standardised with the mean/std of the
     *training part only*, computed without privacy, as in the paper and in DP-FERMI.

   Categorical columns are one-hot encoded over a fixed vocabulary (the public schema of the
   dataset; unseen values map to all-zero columns).  A vocabulary fitted on the training part
   (``None``) is allowed only with ``empirical``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from raco_cli.data.types import TabularData
from raco_cli.errors import DataIntegrityError

PREPROCESSING = ("public", "empirical")
TRANSFORMS = ("none", "log", "log1p", "slog1p")
TEST_FRACTION = 0.25
VAL_FRACTION = 0.15
MIN_ROWS = 20


@dataclass(frozen=True)
class ColumnSpec:
    """How the feature columns of a table are encoded.

    Attributes:
        numeric: columns standardised with train mean/std.
        categorical: column -> vocabulary (ordered category values). ``None`` means the
            vocabulary is the sorted set of values seen in the training part.
        passthrough: numeric columns used as they are (already scaled, e.g. 0/1 flags).
    """

    numeric: Sequence[str] = ()
    categorical: Mapping[str, Sequence[object] | None] = field(default_factory=dict)
    passthrough: Sequence[str] = ()


@dataclass(frozen=True)
class PublicBound:
    """Public range of a numeric column: values are clipped to [lo, hi], transformed, and
    mapped onto [-1, 1] (``transform``: none, log (small positive ratios), log1p (heavy tails),
    or slog1p = sign(x) log1p(|x|) (signed amounts))."""

    lo: float
    hi: float
    transform: str = "none"

    def scale(self, values: np.ndarray) -> np.ndarray:
        """``2 (T(clip(x)) - T(lo)) / (T(hi) - T(lo)) - 1``.

        >>> PublicBound(0.0, 10.0).scale(np.array([-5.0, 0.0, 5.0, 20.0])).tolist()
        [-1.0, -1.0, 0.0, 1.0]
        """
        t = _transform(np.clip(values, self.lo, self.hi), self.transform)
        t_lo, t_hi = _transform(np.array([self.lo, self.hi]), self.transform)
        return 2.0 * (t - t_lo) / (t_hi - t_lo) - 1.0


def _transform(x: np.ndarray, name: str) -> np.ndarray:
    if name == "log":
        return np.log(x)
    if name == "log1p":
        return np.log1p(x)
    if name == "slog1p":
        return np.sign(x) * np.log1p(np.abs(x))
    return x


def parse_bounds(raw: Mapping[str, object] | None, *, dataset: str) -> dict[str, PublicBound]:
    """``dataset.bounds`` (column -> [lo, hi] or [lo, hi, transform]) -> :class:`PublicBound`.

    Raises:
        ConfigError: a malformed entry (one line naming ``dataset.bounds.<column>``).
    """
    from raco_cli.data.provenance import plain_bounds
    from raco_cli.errors import ConfigError

    out: dict[str, PublicBound] = {}
    for col, entry in plain_bounds(raw, dataset=dataset).items():
        key = f"dataset.bounds.{col}"
        ok = isinstance(entry, (list, tuple)) and len(entry) in (2, 3)
        lo, hi = (entry[0], entry[1]) if ok else (None, None)  # type: ignore[index]
        transform = entry[2] if ok and len(entry) == 3 else "none"  # type: ignore[arg-type,index]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in (lo, hi))
        if not ok or not numbers:
            raise ConfigError(f"{key} must be [lo, hi] or [lo, hi, transform] with finite numbers (got {key}={entry!r}); "
                              f"public bounds of the column in conf/dataset/{dataset}.yaml.")
        if not lo < hi:  # type: ignore[operator]
            raise ConfigError(f"{key} must have lo < hi (got {key}={entry!r}); public bounds of the column.")
        if transform not in TRANSFORMS:
            raise ConfigError(f"{key} transform must be one of {', '.join(TRANSFORMS)} (got {transform!r}); "
                              "log1p for heavy tails, slog1p for signed amounts.")
        if (transform == "log1p" and lo <= -1) or (transform == "log" and lo <= 0):  # type: ignore[operator]
            raise ConfigError(f"{key} with {transform} needs lo > {-1 if transform == 'log1p' else 0} (got {key}={entry!r}); "
                              "use slog1p for signed values.")
        out[str(col)] = PublicBound(float(lo), float(hi), str(transform))  # type: ignore[arg-type]
    return out


#: ``dataset.split``: ``record`` (each row's split a keyed hash of its own content: adding or
#: removing a row moves no other row) or ``stratified`` (a seeded shuffle of the whole file,
#: stratified by label x group: the paper's protocol)
SPLITS = ("record", "stratified")
_GOLDEN, _NUMBER, _TEXT, _MISSING = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xA0761D6478BD642F), np.uint64(0xE7037ED1A0B428DB),
                                     np.uint64(0x8EBC6AF09C88C6E3))


def split_rows(y: np.ndarray, group: np.ndarray, *, seed: int, how: str, frame: pd.DataFrame | None = None,
               hashes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The train / val / test split of ``dataset.split`` (:data:`SPLITS`): ``record``, each
    row's from :func:`row_hashes` of ``frame`` (or the given ``hashes``: a loader whose records
    are not table rows, e.g. images); ``stratified``, :func:`stratified_split`."""
    if how == "stratified":
        return stratified_split(y, group, seed=seed)
    if how != "record":
        raise ValueError(f"unknown split {how!r}")
    if hashes is None:
        if frame is None:
            raise ValueError("a record split needs the rows (frame) or their hashes")
        hashes = row_hashes(frame, seed=seed)
    return record_split(hashes)


def record_split(hashes: np.ndarray, *, test_fraction: float = TEST_FRACTION, val_fraction: float = VAL_FRACTION) -> dict[str, np.ndarray]:
    """Each row's split from its own hash (uint64, uniform): test when ``h / 2^64 <
    test_fraction``, validation when below ``test_fraction + (1 - test_fraction) val_fraction``,
    else train (the shared protocol's 25 % and 15 % of the rest, in expectation).  A row's split
    is a function of that row and public configuration alone, so adding or removing a row moves
    no other row (docs/privacy.md, "The split").  Identical rows share a split.

    >>> s = record_split(np.repeat(np.array([0, 2**62, 2**63, 2**64 - 1], dtype=np.uint64), 5))  # (u = 0, 0.25, 0.5, ~1) x 5
    >>> s["test"].tolist(), s["val"].tolist(), s["train"].tolist() == list(range(10, 20))
    ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9], True)
    """
    n = len(hashes)
    if n < MIN_ROWS:
        raise DataIntegrityError(
            f"The dataset has {n} usable rows; at least {MIN_ROWS} are needed for the split protocol "
            "(25 % test, 15 % of the rest validation). Check the data files."
        )
    u = hash_uniforms(hashes)
    test = u < test_fraction
    val = ~test & (u < test_fraction + (1.0 - test_fraction) * val_fraction)
    splits = {"train": np.flatnonzero(~test & ~val), "val": np.flatnonzero(val), "test": np.flatnonzero(test)}
    empty = [name for name, rows in splits.items() if len(rows) == 0]
    if empty:
        raise DataIntegrityError(f"The per-record split of {n} rows left the {empty[0]} split empty; the table is too small for "
                                 "dataset.split=record (use more rows).")
    return splits


def hash_uniforms(hashes: np.ndarray) -> np.ndarray:
    """Uniform uint64 hashes as float64 in [0, 1) (their top 53 bits): the position a per-record
    split compares with its fractions."""
    return (np.asarray(hashes, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def word_hashes(words: np.ndarray, *, seed: int) -> np.ndarray:
    """A uint64 hash of every row of ``words`` (n, m) uint64, keyed by ``seed``: the records of a
    loader whose rows are raw bits (an image's pixels), mixed column by column as
    :func:`row_hashes` mixes its cells."""
    with np.errstate(over="ignore"):
        h = np.full(len(words), _mix(np.asarray([np.uint64(seed) ^ _GOLDEN]))[0], dtype=np.uint64)
        for j in range(words.shape[1]):
            h = _mix(h ^ _mix(words[:, j] + np.uint64(j + 1) * _GOLDEN))
    return h


def row_hashes(frame: pd.DataFrame, *, seed: int) -> np.ndarray:
    """A uint64 hash of every row's own cells, keyed by ``seed`` (``dataset.split_seed``).

    Each cell counts by its value, not by how the file or pandas typed its column (a column
    turns to text when another row holds a word, or to float when another row is missing):
    a cell that reads as a number counts as that float64 (``39``, ``39.0`` and ``'39'`` alike;
    ``-0.0`` as ``0.0``), any other text as its stripped string, an empty or missing cell as
    missing.  The columns count in the file's order (its header is public)."""
    with np.errstate(over="ignore"):
        h = np.full(len(frame), _mix(np.asarray([np.uint64(seed) ^ _GOLDEN]))[0], dtype=np.uint64)
        key = _mix(np.asarray([np.uint64(seed) + _TEXT]))[0]
        hash_key = f"{int(key):016x}"[:16]  # pandas' siphash key: 16 characters
        for j, name in enumerate(frame.columns):
            col = frame[name]
            number = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan) + 0.0
            part = np.full(len(frame), _MISSING, dtype=np.uint64)
            is_number = np.isfinite(number) | np.isinf(number)
            part[is_number] = _mix(number[is_number].view(np.uint64) ^ _NUMBER)
            text = ~is_number & col.notna().to_numpy()
            if text.any():
                values = col[text].astype(str).str.strip()
                blank = (values == "").to_numpy()
                hashed = pd.util.hash_array(values.to_numpy(dtype=object), hash_key=hash_key, categorize=False)
                part[np.flatnonzero(text)] = np.where(blank, _MISSING, hashed ^ _TEXT)
            h = _mix(h ^ _mix(part + np.uint64(j + 1) * _GOLDEN))
    return h


def stratified_split(
    y: np.ndarray,
    group: np.ndarray,
    *,
    seed: int,
    test_fraction: float = TEST_FRACTION,
    val_fraction: float = VAL_FRACTION,
) -> dict[str, np.ndarray]:
    """Split row indices into train/val/test, stratified by the (label, group) cell.

    Cells too small to stratify (fewer than 2 rows) are merged into one stratum.

    Returns:
        ``{"train", "val", "test"}`` -> sorted int64 index arrays.
    """
    n = len(y)
    if n < MIN_ROWS:
        raise DataIntegrityError(
            f"The dataset has {n} usable rows; at least {MIN_ROWS} are needed for the split protocol "
            "(25 % test, 15 % of the rest validation). Check the data files."
        )
    idx = np.arange(n)
    rest, test = _split(idx, test_fraction, seed, label_group_strata(y, group), y)
    train, val = _split(rest, val_fraction, seed, label_group_strata(y[rest], group[rest]), y[rest])
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def _split(idx: np.ndarray, fraction: float, seed: int, strata: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    """One stratified split; a small table with many (label, group) cells (e.g. intersectional
    groups) whose part is smaller than the number of cells is stratified by label only, or not
    at all (where scikit-learn would refuse).  Tables that can be stratified are unaffected."""
    for stratify in (strata, labels):
        try:
            return train_test_split(idx, test_size=fraction, random_state=seed, stratify=stratify)
        except ValueError:
            continue
    return train_test_split(idx, test_size=fraction, random_state=seed, stratify=None)


def label_group_strata(y: np.ndarray, group: np.ndarray) -> np.ndarray:
    """The stratum of each row for a stratified split: its (label, group) cell.  Cells of fewer
    than 4 rows (too few to be split twice) are pooled into one stratum, and the pool's rows
    take their label as stratum when the pool itself is that small.  The image splits
    (:func:`raco_cli.data.images.pool_split`) stratify the same way."""
    cells = y.astype(np.int64) * (int(group.max()) + 1) + group.astype(np.int64)
    values, counts = np.unique(cells, return_counts=True)
    rare = set(values[counts < 4].tolist())
    if rare:
        cells = np.where(np.isin(cells, list(rare)), -1, cells)
        if np.sum(cells == -1) < 4:  # still too small: fall back to label-only strata
            cells = np.where(cells == -1, y, cells)
    return cells


def encode_features(
    df: pd.DataFrame,
    columns: ColumnSpec,
    train_rows: np.ndarray,
    *,
    preprocessing: str = "empirical",
    bounds: Mapping[str, PublicBound] | None = None,
    dataset: str = "",
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Encode feature columns: ``public`` from the public ``bounds`` only, ``empirical``
    fitting every statistic on ``train_rows`` only (module docstring).

    Returns:
        X of shape (n, d) float32 and the d feature names.

    Raises:
        ConfigError: ``public`` without a bound for a numeric column, or with a vocabulary
            that would be fitted on the data.
    """
    from raco_cli.errors import ConfigError

    public = preprocessing == "public"
    if public:
        missing = [c for c in columns.numeric if c not in (bounds or {})]
        if missing:
            raise ConfigError(
                f"dataset.bounds.{missing[0]} is missing (dataset.preprocessing=public needs public bounds for every numeric "
                f"column: {', '.join(missing)}); declare them in conf/dataset/{dataset or '<name>'}.yaml or use "
                "dataset.preprocessing=empirical (privacy.scope=paper)."
            )
        fitted = [c for c, v in columns.categorical.items() if v is None]
        if fitted:
            raise ConfigError(f"dataset.preprocessing=public needs a public level list for column {fitted[0]}; "
                              "use dataset.preprocessing=empirical (privacy.scope=paper).")
    blocks: list[np.ndarray] = []
    names: list[str] = []
    train = df.iloc[train_rows]
    for col in columns.numeric:
        values = pd.to_numeric(df[col], errors="raise").to_numpy(dtype=np.float64)
        if public:
            blocks.append(bounds[col].scale(values)[:, None])  # type: ignore[index]
        else:
            mean = float(train[col].astype(np.float64).mean())
            std = float(train[col].astype(np.float64).std(ddof=0))
            blocks.append(((values - mean) / (std if std > 0 else 1.0))[:, None])
        names.append(col)
    for col in columns.passthrough:
        blocks.append(pd.to_numeric(df[col], errors="raise").to_numpy(dtype=np.float64)[:, None])
        names.append(col)
    for col, vocab in columns.categorical.items():
        cats = list(vocab) if vocab is not None else sorted(train[col].unique().tolist())
        values = df[col].to_numpy()
        onehot = np.stack([values == c for c in cats], axis=1).astype(np.float64)
        blocks.append(onehot)
        names.extend(f"{col}={c}" for c in cats)
    if not blocks:
        raise DataIntegrityError("No feature columns configured.")
    X = np.concatenate(blocks, axis=1).astype(np.float32)
    if not np.isfinite(X).all():
        raise DataIntegrityError("Non-finite feature values after preprocessing.")
    return X, tuple(names)


def build_tabular(
    name: str,
    df: pd.DataFrame,
    *,
    y: np.ndarray,
    group: np.ndarray,
    columns: ColumnSpec,
    class_names: Sequence[str],
    group_names: Sequence[str],
    split_seed: int,
    source: str,
    meta: Mapping[str, object] | None = None,
    splits: Mapping[str, np.ndarray] | None = None,
    preprocessing: str = "empirical",
    bounds: Mapping[str, object] | None = None,
    split: str = "stratified",
) -> TabularData:
    """Split, encode and wrap a cleaned table into :class:`TabularData`.

    ``preprocessing``/``bounds``: ``dataset.preprocessing`` and ``dataset.bounds`` (module
    docstring); the mode is recorded in ``meta["preprocessing"]``.

    ``splits`` overrides the shared split (a loader whose label depends on the training part
    computes the split first, see ``parkinsons``); ``split``: ``dataset.split``
    (:data:`SPLITS`), a record split hashing the rows of ``df``.
    """
    y = np.asarray(y, dtype=np.int64)
    group = np.asarray(group, dtype=np.int64)
    if splits is None:
        splits = split_rows(y, group, seed=split_seed, how=split, frame=df)
    X, feature_names = encode_features(
        df.reset_index(drop=True), columns, splits["train"], preprocessing=preprocessing,
        bounds=parse_bounds(bounds, dataset=name), dataset=name,
    )
    return TabularData(
        name=name,
        X=X,
        y=y,
        group=group,
        feature_names=feature_names,
        class_names=tuple(class_names),
        group_names=tuple(group_names),
        splits=splits,
        source=source,
        # the first len(numeric) columns of X are the numeric features (encode_features' order):
        # dataset.preprocessing=dp standardises them privately after loading
        meta={**dict(meta or {}), "preprocessing": preprocessing, "numeric_features": len(columns.numeric)},
    )


def require_columns(df: pd.DataFrame, required: Sequence[str], *, dataset: str, path: str) -> None:
    """Fail with one line when a table lacks expected columns (wrong or truncated file)."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataIntegrityError(
            f"{path} is not a valid '{dataset}' file: missing columns {missing}. "
            f"Delete it and fetch it again with: make data DATASET={dataset}"
        )
