"""The description of a user's table (``dataset=table``): how its columns become features,
labels and sensitive groups.

One :class:`TableSchema` serves training (:mod:`raco_cli.data.table`) and prediction
(:mod:`raco_cli.predictor`), so a row is encoded the same way in both, bit for bit.  It is
plain data (``to_dict``/``from_dict``, JSON), written beside the model in the run's artifact.

Cells are compared as text (:func:`token`): strings without surrounding blanks, integral
numbers without a decimal point (``1.0`` and ``1`` are both ``"1"``), booleans as ``True`` /
``False``.  A cell is *missing* when it is empty, one of pandas' missing markers (``NA``,
``NaN``, ``null``, ...) or one of the schema's ``na_values``.

Feature columns (``X``, float32, in this order):

1. ``numeric``: under public preprocessing clipped to the column's public bounds and mapped
   onto [-1, 1] (:class:`raco_cli.data.tabular.PublicBound`); under empirical preprocessing
   standardised with the training part's mean/std.  A missing value is encoded 0 (the
   public midpoint, which ``dataset.preprocessing=dp`` then replaces by the DP mean; resp.
   the training mean).
2. one ``<col>=missing`` indicator (1 when missing) per column listed in ``missing_indicator``;
3. ``binary``: 1 for the second level, 0 for the first, 0.5 when missing or unknown;
4. ``categorical``: one-hot over the public level list, plus ``<col>=other`` (a value outside
   the list) when the unknown-level rule is ``other``; a missing value sets no column.

Label and groups: a row whose label or sensitive value is missing or outside its list has
no class or no group; the loader drops it before the split and counts it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from raco_cli.data.tabular import PublicBound
from raco_cli.errors import DataIntegrityError

FORMAT_VERSION = 1
GROUP_SEPARATOR = "&"  # intersectional group names: "Female&Black"


def token(value: object) -> str | None:
    """A cell as text, or None when it is missing.

    >>> [token(v) for v in (" a ", 1, 1.0, 2.5, True, None, float("nan"), "")]
    ['a', '1', '1', '2.5', 'True', None, None, None]
    """
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if np.isnan(v):
            return None
        return str(int(v)) if v.is_integer() else repr(v)
    text = str(value).strip()
    return text or None


def tokens(series: pd.Series, na_values: Iterable[str] = ()) -> np.ndarray:
    """Every cell of a column as :func:`token` (object array, None = missing)."""
    na = set(na_values)
    out = np.array([token(v) for v in series.to_numpy(dtype=object)], dtype=object)
    if na:
        out[np.array([t in na for t in out], dtype=bool)] = None
    return out


def member(text: np.ndarray, values: Iterable[str]) -> np.ndarray:
    """Whether each token is one of ``values`` (a set lookup: np.isin would sort None with text).

    >>> member(np.array(["a", None, "c"], dtype=object), ("a", "b")).tolist()
    [True, False, False]
    """
    allowed = set(values)
    return np.fromiter((t in allowed for t in text), dtype=bool, count=len(text))


def numbers(series: pd.Series, *, column: str, where: str, na_values: Iterable[str] = (), fix: str = "",
            text_as_missing: bool = False) -> np.ndarray:
    """A numeric column as float64, NaN where missing (``text_as_missing``: also where a cell
    is not a finite number, instead of the error).

    Raises:
        DataIntegrityError: a cell that is neither missing nor a finite number (one line
            naming the column, the row and the value).
    """
    if pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype):
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
        present = ~np.isnan(values)
        text = None
    else:
        text = tokens(series, na_values)
        present = np.array([t is not None for t in text], dtype=bool)
        values = pd.to_numeric(pd.Series(text, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    bad = present & ~np.isfinite(values)
    if text_as_missing:
        return np.where(bad, np.nan, values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        shown = text[row] if text is not None else series.iloc[row]
        raise DataIntegrityError(
            f"{where}: column '{column}' is numeric but row {row + 1} holds {shown!r} (not a finite number); "
            + (fix or f"declare it categorical (dataset.options.types.{column}=categorical), add the value to "
               "dataset.options.na_values if it marks a missing value, or fix the file.")
        )
    return values


@dataclass(frozen=True)
class NumericColumn:
    """A numeric feature: public bounds (``bound``) or empirical ``mean``/``std``.
    ``text_as_missing``: a cell that is no number is read as missing (a type decided privately,
    :mod:`raco_cli.privacy.estimates`: how many such cells the file holds is not public)."""

    name: str
    bound: PublicBound | None = None
    mean: float = 0.0
    std: float = 1.0
    indicator: bool = False
    text_as_missing: bool = False

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Encoded values, 0 where missing (module docstring)."""
        if self.bound is not None:
            out = self.bound.scale(values)
        else:  # the paper's standardisation (raco_cli.data.tabular.encode_features)
            out = (values - self.mean) / (self.std if self.std > 0 else 1.0)
        return np.where(np.isnan(values), 0.0, out)

    def to_dict(self) -> dict[str, Any]:
        bound = None if self.bound is None else [self.bound.lo, self.bound.hi, self.bound.transform]
        return {"name": self.name, "type": "numeric", "bound": bound, "mean": self.mean, "std": self.std,
                "indicator": self.indicator, **({"text_as_missing": True} if self.text_as_missing else {})}


@dataclass(frozen=True)
class BinaryColumn:
    """A two-level feature: one 0/1 column (1 = ``levels[1]``)."""

    name: str
    levels: tuple[str, str]
    indicator: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": "binary", "levels": list(self.levels), "indicator": self.indicator}


@dataclass(frozen=True)
class CategoricalColumn:
    """A categorical feature: one-hot over ``levels`` (+ ``<name>=other`` when ``other``)."""

    name: str
    levels: tuple[str, ...]
    other: bool = True
    indicator: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": "categorical", "levels": list(self.levels), "other": self.other,
                "indicator": self.indicator}


Column = NumericColumn | BinaryColumn | CategoricalColumn


@dataclass(frozen=True)
class Encoded:
    """Encoded features and what the rules did to each column.

    Attributes:
        X: features, shape (n, d) float32.
        masks: column -> {``missing``, ``clipped`` (numeric, outside its public bounds),
            ``unknown`` (binary/categorical, outside its level list)} -> bool (n,).
    """

    X: np.ndarray
    masks: dict[str, dict[str, np.ndarray]]


@dataclass(frozen=True)
class TableEncoder:
    """Feature columns of a table and their encoding (module docstring)."""

    columns: tuple[Column, ...]

    @property
    def numeric(self) -> tuple[NumericColumn, ...]:
        return tuple(c for c in self.columns if isinstance(c, NumericColumn))

    @property
    def feature_names(self) -> tuple[str, ...]:
        names = [c.name for c in self.numeric]
        names += [f"{c.name}=missing" for c in self.columns if c.indicator]
        names += [c.name for c in self.columns if isinstance(c, BinaryColumn)]
        for c in self.columns:
            if isinstance(c, CategoricalColumn):
                names += [f"{c.name}={level}" for level in c.levels] + ([f"{c.name}=other"] if c.other else [])
        return tuple(names)

    def encode(self, df: pd.DataFrame, *, na_values: Sequence[str] = (), where: str = "the table", fix: str = "") -> Encoded:
        """Encode the feature columns of ``df`` (which must have them all).

        Raises:
            DataIntegrityError: a numeric column holds a value that is not a number.
        """
        n = len(df)
        masks: dict[str, dict[str, np.ndarray]] = {}
        numeric_blocks, indicator_blocks, binary_blocks, categorical_blocks = [], [], [], []
        for col in self.columns:
            if isinstance(col, NumericColumn):
                values = numbers(df[col.name], column=col.name, where=where, na_values=na_values, fix=fix,
                                 text_as_missing=col.text_as_missing)
                missing = np.isnan(values)
                clipped = ~missing & ((values < col.bound.lo) | (values > col.bound.hi)) if col.bound else np.zeros(n, bool)
                numeric_blocks.append(col.encode(values)[:, None])
                masks[col.name] = {"missing": missing, "clipped": clipped}
                continue
            text = tokens(df[col.name], na_values)
            missing = np.array([t is None for t in text], dtype=bool)
            known = member(text, col.levels)
            masks[col.name] = {"missing": missing, "unknown": ~missing & ~known}
            if isinstance(col, BinaryColumn):
                binary_blocks.append(np.where(text == col.levels[1], 1.0, np.where(text == col.levels[0], 0.0, 0.5))[:, None])
            else:
                onehot = [(text == level) for level in col.levels]
                if col.other:
                    onehot.append(~missing & ~known)
                categorical_blocks.append(np.stack(onehot, axis=1).astype(np.float64))
        for col in self.columns:
            if col.indicator:
                indicator_blocks.append(masks[col.name]["missing"].astype(np.float64)[:, None])
        blocks = numeric_blocks + indicator_blocks + binary_blocks + categorical_blocks
        X = np.concatenate(blocks, axis=1).astype(np.float32) if blocks else np.zeros((n, 0), np.float32)
        return Encoded(X=X, masks=masks)

    def to_dict(self) -> dict[str, Any]:
        return {"columns": [c.to_dict() for c in self.columns]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TableEncoder:
        cols: list[Column] = []
        for c in raw["columns"]:
            if c["type"] == "numeric":
                b = c.get("bound")
                bound = None if b is None else PublicBound(float(b[0]), float(b[1]), str(b[2]))
                cols.append(NumericColumn(c["name"], bound, float(c["mean"]), float(c["std"]), bool(c["indicator"]),
                                          bool(c.get("text_as_missing", False))))
            elif c["type"] == "binary":
                cols.append(BinaryColumn(c["name"], (str(c["levels"][0]), str(c["levels"][1])), bool(c["indicator"])))
            else:
                cols.append(CategoricalColumn(c["name"], tuple(str(v) for v in c["levels"]), bool(c["other"]), bool(c["indicator"])))
        return cls(tuple(cols))


@dataclass(frozen=True)
class Target:
    """The label of a table and its classes.

    ``rule``: ``levels`` (class i is ``levels[i]``; binary or multi-class), ``positive``
    (class 1 when the label is one of ``positive``, class 0 for any other value),
    ``threshold`` (a numeric label; class 1 when it is above ``threshold``) or ``rest``
    (class i is ``levels[i]`` and every other value is the last class, ``class_names[-1]``:
    a private level list that released one class only, :func:`raco_cli.data.table._filled`).
    """

    column: str
    rule: str
    class_names: tuple[str, ...]
    levels: tuple[str, ...] = ()
    positive: tuple[str, ...] = ()
    threshold: float | None = None

    def classes(self, df: pd.DataFrame, *, na_values: Sequence[str] = (), where: str = "the table") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(y, missing, unknown)``: class index per row (-1 where missing or unknown)."""
        if self.rule == "threshold":
            values = numbers(df[self.column], column=self.column, where=where, na_values=na_values,
                             fix="the label of dataset.options.threshold must be a number; fix the file or add the value to dataset.options.na_values.")
            missing = np.isnan(values)
            y = np.where(missing, -1, (values > float(self.threshold)).astype(np.int64))  # type: ignore[arg-type]
            return y.astype(np.int64), missing, np.zeros(len(df), bool)
        text = tokens(df[self.column], na_values)
        missing = np.array([t is None for t in text], dtype=bool)
        if self.rule == "positive":
            y = member(text, self.positive).astype(np.int64)
            return np.where(missing, -1, y), missing, np.zeros(len(df), bool)
        index = {level: i for i, level in enumerate(self.levels)}
        if self.rule == "rest":
            y = np.array([index.get(t, len(self.levels)) if t is not None else -1 for t in text], dtype=np.int64)
            return y, missing, np.zeros(len(df), bool)
        y = np.array([index.get(t, -1) if t is not None else -1 for t in text], dtype=np.int64)
        return y, missing, ~missing & (y < 0)

    def to_dict(self) -> dict[str, Any]:
        return {"column": self.column, "rule": self.rule, "class_names": list(self.class_names), "levels": list(self.levels),
                "positive": list(self.positive), "threshold": self.threshold}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Target:
        return cls(str(raw["column"]), str(raw["rule"]), tuple(raw["class_names"]), tuple(raw["levels"]),
                   tuple(raw["positive"]), None if raw["threshold"] is None else float(raw["threshold"]))


@dataclass(frozen=True)
class Groups:
    """Sensitive groups: the product of the level lists of one or more columns
    (intersectional groups, named ``a&b``), in row-major order.  A column with ``rest[i]``
    True puts every value outside its list but the last into the last level (``not a``: a
    private list that released one group only, :func:`raco_cli.data.table._filled`)."""

    columns: tuple[str, ...]
    levels: tuple[tuple[str, ...], ...]
    rest: tuple[bool, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(GROUP_SEPARATOR.join(combo) for combo in itertools.product(*self.levels))

    def index(self, df: pd.DataFrame, *, na_values: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(group, missing, unknown)``: group index per row (-1 where a sensitive value is
        missing or outside its list)."""
        n = len(df)
        group = np.zeros(n, dtype=np.int64)
        missing = np.zeros(n, dtype=bool)
        unknown = np.zeros(n, dtype=bool)
        rest = self.rest or (False,) * len(self.columns)
        for col, levels, other in zip(self.columns, self.levels, rest):
            text = tokens(df[col], na_values)
            miss = np.array([t is None for t in text], dtype=bool)
            pos = {level: i for i, level in enumerate(levels[:-1] if other else levels)}
            fallback = len(levels) - 1 if other else -1
            idx = np.array([pos.get(t, fallback) if t is not None else -1 for t in text], dtype=np.int64)
            missing |= miss
            unknown |= ~miss & (idx < 0)
            group = group * len(levels) + np.maximum(idx, 0)
        return np.where(missing | unknown, -1, group), missing, unknown

    def to_dict(self) -> dict[str, Any]:
        return {"columns": list(self.columns), "levels": [list(v) for v in self.levels], "rest": list(self.rest)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Groups:
        return cls(tuple(raw["columns"]), tuple(tuple(v) for v in raw["levels"]), tuple(bool(r) for r in raw.get("rest", ())))


@dataclass(frozen=True)
class TableSchema:
    """Everything needed to turn rows of the table into model inputs, labels and groups."""

    target: Target
    groups: Groups
    encoder: TableEncoder
    na_values: tuple[str, ...] = ()

    @property
    def feature_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.encoder.columns)

    def to_dict(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "target": self.target.to_dict(), "groups": self.groups.to_dict(),
                "encoder": self.encoder.to_dict(), "na_values": list(self.na_values)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TableSchema:
        if raw.get("version") != FORMAT_VERSION:
            raise DataIntegrityError(f"Unsupported table schema version {raw.get('version')!r} (this raco reads version {FORMAT_VERSION}).")
        return cls(Target.from_dict(raw["target"]), Groups.from_dict(raw["groups"]), TableEncoder.from_dict(raw["encoder"]),
                   tuple(raw.get("na_values", ())))
