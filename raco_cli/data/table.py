"""``dataset=table``: your own CSV (plain or gzip) or Parquet file.

Options (``dataset.options``, documented in ``conf/dataset/table.yaml`` and
``docs/your-own-data.md``): ``path`` (one file or a list, concatenated), ``label`` with
``positive`` values or a ``threshold`` (else the classes are the label's level list:
binary or multi-class), ``sensitive`` (one column, or several for intersectional groups),
``features`` (default: every other column), ``types`` (``numeric``, ``categorical``,
``binary``, ``drop``; default: inferred), ``levels`` (public level lists), ``missing``,
``missing_indicator``, ``unknown``, ``na_values``, ``class_names``; public numeric bounds
go in ``dataset.bounds`` as for every dataset.

A column's type is, in order: ``types[col]``; ``numeric`` when it has ``dataset.bounds``;
``categorical`` when it has ``levels``; else the file's storage (numbers -> numeric, booleans
-> binary, text -> categorical).  Under ``privacy.scope=model`` (``dataset.preprocessing``
public or dp) every numeric column needs public bounds and every other used column (label,
sensitive, categorical, binary) a public level list: nothing about the encoding is read from
the data, so the types follow from the configuration alone.  ``types[col]: private`` (what
``raco data describe`` writes) is decided per run with the column's bounds or level list from
noisy counts of the training split (:mod:`raco_cli.privacy.estimates`, :func:`_filled`); under
empirical preprocessing it is the file's own type (:func:`file_type`).  Under ``privacy.scope=paper``
(``empirical``) missing level lists are taken from the data (label and groups: every row;
features: the training part) and numeric columns are standardised with the training part's
mean/std, as for the benchmark datasets.

Rules (counted, never silent; :func:`report_lines`):

* rows whose label or a sensitive value is missing or outside its list are dropped before
  the split (they have no class or group); with ``missing: drop`` so are rows with a
  missing feature value;
* ``missing: impute`` (default): a missing numeric value is imputed at the column's mean
  (``dp``: the DP mean; ``empirical``: the training mean; ``public``: the public midpoint),
  a missing binary value at 0.5, a missing categorical value as no level;
  ``missing_indicator`` columns also get a ``<col>=missing`` feature;
* numeric values outside the public bounds are clipped to them;
* a categorical value outside the level list sets ``<col>=other`` (``unknown: other``) or no
  column (``unknown: zero``); an unknown binary value is encoded 0.5.

Then the shared split protocol (:func:`raco_cli.data.tabular.split_rows`: by each row's own cells under ``dataset.split=record``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

import numpy as np
import pandas as pd

from raco_cli.data import provenance
from raco_cli.data.provenance import Estimates
from raco_cli.data.schema import (
    BinaryColumn,
    CategoricalColumn,
    Column,
    Groups,
    NumericColumn,
    TableEncoder,
    TableSchema,
    Target,
    member,
    numbers,
    tokens,
)
from raco_cli.data.tabular import MIN_ROWS, PublicBound, parse_bounds, split_rows
from raco_cli.data.types import SPLITS, TabularData
from raco_cli.errors import ConfigError, DataIntegrityError, DataNotFoundError

log = logging.getLogger(__name__)

TYPES = provenance.TYPE_NAMES  # dataset.options.types.<col>: one of these, `private` or {type: t, source: public|data}
PRIVATE_TYPE = "private"
MISSING_RULES = ("impute", "drop")
UNKNOWN_RULES = ("other", "zero")
SCOPE_HINT = "`raco data describe FILE` prints a starting YAML; or train with privacy.scope=paper (empirical statistics)"
_EMPTY: Mapping[str, Any] = MappingProxyType({})


# --- reading ------------------------------------------------------------------------------


DELIMITERS = (",", ";", "\t", "|")


def header_line(file: Path) -> str:
    """The first line of a CSV file (plain or gzip, by content), as text ('' when unreadable)."""
    import gzip

    try:
        with open(file, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        with (gzip.open(file, "rb") if gz else open(file, "rb")) as fh:
            return fh.readline(1 << 20).decode("utf-8", errors="replace").rstrip("\r\n")
    except (OSError, EOFError):
        return ""


def sniff_delimiter(header: str) -> str:
    """The delimiter of a CSV file from its header line: the one of ``, ; TAB |`` that occurs
    most outside quotes (a comma when none does).

    >>> sniff_delimiter("id;age;sex"), sniff_delimiter("a,b"), sniff_delimiter("a\\tb\\tc"), sniff_delimiter("only")
    (';', ',', '\\t', ',')
    """
    outside, quoted = [], False
    for ch in header:
        if ch == '"':
            quoted = not quoted
        elif not quoted:
            outside.append(ch)
    text = "".join(outside)
    counts = {d: text.count(d) for d in DELIMITERS}
    best = max(DELIMITERS, key=lambda d: counts[d])
    return best if counts[best] else ","


# the first bytes of files that are no text table, and what each is (a CSV must be UTF-8 text)
SIGNATURES = (
    (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"), (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive (an Excel .xlsx workbook is one: save its sheet as CSV)"),
    (b"\xd0\xcf\x11\xe0", "an Office document (an Excel .xls workbook is one: save its sheet as CSV)"),
    (b"SQLite format 3\x00", "an SQLite database"), (b"BZh", "a bzip2 archive (only gzip is read: gunzip-able .gz or plain)"),
    (b"\xfd7zXZ", "an xz archive (only gzip is read)"), (b"7z\xbc\xaf", "a 7-Zip archive (only gzip is read)"),
)  # fmt: skip


def not_text(file: Path, key: str) -> str | None:
    """The one-line error for a ``file`` that is no UTF-8 text (read after gzip when gzipped),
    else None: a known format by its first bytes, binary data (NUL bytes), another encoding."""
    import gzip

    try:
        with open(file, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        with (gzip.open(file, "rb") if gz else open(file, "rb")) as fh:
            head = fh.read(1 << 16)
    except (OSError, EOFError) as exc:
        return f"{key}: {file} cannot be read ({exc}); check the file (a CSV plain or .gz, or a Parquet file)."
    what = next((what for magic, what in SIGNATURES if head.startswith(magic)), None)
    if what is None and b"\x00" in head:
        what = "binary data (NUL bytes)"
    if what is not None:
        return f"{key}: {file} is not a text table: it holds {what}; give a CSV file (plain or .gz) or a Parquet file."
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not a character cut at the end of the chunk read
            return (f"{key}: {file} is not UTF-8 text (byte 0x{head[exc.start]:02x} at offset {exc.start}); re-save it as UTF-8, "
                    f"e.g. iconv -f latin1 -t utf-8 {file} > {file.with_name(file.stem + '.utf8.csv')}.")
    return None


def duplicate_headers(header: str, delimiter: str) -> dict[str, list[int]]:
    """Column names that the header line holds more than once -> their 1-based positions
    (pandas reads the second ``x`` as ``x.1``).

    >>> duplicate_headers("a,b,a,c,a", ",")
    {'a': [1, 3, 5]}
    """
    import csv

    names = [n.strip() for n in next(csv.reader([header], delimiter=delimiter), [])]
    seen: dict[str, list[int]] = {}
    for i, name in enumerate(names, start=1):
        seen.setdefault(name, []).append(i)
    return {name: pos for name, pos in seen.items() if len(pos) > 1}


def read_table(path: str | Sequence[str], *, na_values: Sequence[str] = (), key: str = "dataset.options.path",
               delimiter: str | None = None) -> pd.DataFrame:
    """Read one CSV (plain or gzip, by content) or Parquet file, or several with the same
    columns (concatenated in order).  CSV cells are read as text (the first line is the
    header); pandas' missing markers and ``na_values`` become missing.  ``delimiter``: the
    CSV field separator (None: sniffed from the header line, :func:`sniff_delimiter`).  A
    header that names a column twice is read as pandas does (``x``, ``x.1``) and said in one
    warning line naming the column and its positions.

    Raises:
        DataNotFoundError: a file does not exist.
        DataIntegrityError: a file cannot be parsed, is empty, or the files' columns differ.
    """
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if not paths:
        raise ConfigError(f"{key} is empty; give the path of a CSV or Parquet file (or a list of them).")
    if delimiter is not None and (not isinstance(delimiter, str) or len(delimiter) != 1):
        raise ConfigError(f"dataset.options.delimiter must be one character or null (got dataset.options.delimiter={delimiter!r}); "
                          "e.g. ';' or '\\t' (null: read from the header line).")
    frames: list[pd.DataFrame] = []
    for p in paths:
        file = Path(str(p)).expanduser()
        if not file.is_file():
            raise DataNotFoundError(f"{key}: no file {file} (working directory {Path.cwd()}); give the path of your CSV "
                                    "(plain or .gz) or Parquet file.")
        with open(file, "rb") as fh:
            magic = fh.read(4)
        sep = ","
        problem = None if magic == b"PAR1" else not_text(file, key)
        if problem is not None:
            raise DataIntegrityError(problem)
        try:
            if magic == b"PAR1":
                df = pd.read_parquet(file)
                df.columns = [str(c) for c in df.columns]
            else:
                header = header_line(file)
                sep = delimiter or sniff_delimiter(header)
                for name, positions in duplicate_headers(header, sep).items():
                    log.warning("%s: the header names the column %r %d times (positions %s); read as %s.", file, name,
                                len(positions), ", ".join(map(str, positions)),
                                ", ".join([repr(name)] + [repr(f"{name}.{i}") for i in range(1, len(positions))]))
                df = pd.read_csv(file, dtype=str, keep_default_na=True, na_values=list(na_values), skipinitialspace=True,
                                 sep=sep, compression="gzip" if magic[:2] == b"\x1f\x8b" else None)
        except (ValueError, OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            # a row with more fields than the header: the separator is the likely cause, for nothing else
            fields = isinstance(exc, pd.errors.ParserError) and not delimiter
            raise DataIntegrityError(f"{file} is not a readable CSV or Parquet file ({first}); check the file"
                                     + (f" (fields read as separated by {sep!r}: set dataset.options.delimiter)" if fields else "")
                                     + ".") from None
        if df.empty:
            raise DataIntegrityError(f"{file} has no rows; check the file.")
        if magic != b"PAR1" and len(df.columns) == 1:  # prose, or fields separated by something else: no label and group
            found = sniff_delimiter(header)
            if delimiter and found != delimiter and found in header:
                raise DataIntegrityError(f"{key}: {file} reads as one column ({str(df.columns[0])[:40]!r}) with the field separator "
                                         f"{delimiter!r}, but its header line separates its fields by {found!r}: set "
                                         f"dataset.options.delimiter={found!r} (raco data describe --delimiter), or null to read it "
                                         "from the header.")
            how = (f"with the field separator {delimiter!r}" if delimiter else
                   "its header line has none of the separators , ; TAB | (a text file, not a table?)")
            raise DataIntegrityError(f"{key}: {file} reads as one column ({str(df.columns[0])[:40]!r}) {how}; a table needs a "
                                     "label and a sensitive column: give a CSV/TSV file, or its field separator "
                                     "(dataset.options.delimiter, raco data describe --delimiter, e.g. ' ').")
        if frames and list(df.columns) != list(frames[0].columns):
            raise DataIntegrityError(f"{file} has columns {list(df.columns)[:6]}..., the first file {list(frames[0].columns)[:6]}...; "
                                     f"the files of {key} must have the same columns in the same order.")
        frames.append(df)
    out = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    dup = out.columns[out.columns.duplicated()].tolist()
    if dup:
        raise DataIntegrityError(f"{paths[0]} has the column {dup[0]!r} twice; column names must be unique.")
    return out


def _names(value: object, key: str) -> tuple[str, ...]:
    """A column name or a list of them."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{key} must be a column name or a list of them (got {key}={value!r}).")


def _levels_of(values: object, key: str, series: pd.Series | None = None) -> tuple[str, ...]:
    """A configured level list as tokens.  ``series``: the column it describes (its storage
    tells YAML booleans from a real boolean column)."""
    from raco_cli.data.schema import token

    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(f"{key} must be a non-empty list of values (got {key}={values!r}); e.g. ['no', 'yes'].")
    if any(isinstance(v, bool) for v in values) and (series is None or not pd.api.types.is_bool_dtype(series.dtype)):
        raise ConfigError(f"{key} holds the booleans {list(values)}: YAML reads unquoted no/yes, on/off and true/false as "
                          f"booleans, and the column holds text; quote the values, e.g. {key}=['no', 'yes'].")
    out = tuple(token(v) for v in values)
    if any(t is None for t in out):
        raise ConfigError(f"{key} holds an empty value (got {key}={values!r}); missing values have their own rule (dataset.options.missing).")
    if len(set(out)) != len(out):
        raise ConfigError(f"{key} lists a value twice (got {key}={values!r}).")
    return out  # type: ignore[return-value]


def _values_in(df: pd.DataFrame, column: str, na_values: Sequence[str], limit: int = 12) -> str:
    """The distinct values of a column, for an error message (the user's own terminal)."""
    lv = sorted_levels(tokens(df[column], na_values))
    return ", ".join(lv[:limit]) + (f", ... ({len(lv)} values)" if len(lv) > limit else "") if lv else "none: every cell is missing"


def sorted_levels(values: np.ndarray) -> tuple[str, ...]:
    """Distinct non-missing tokens, numerically sorted when they are all numbers.

    >>> sorted_levels(np.array(["10", "9", None, "9"], dtype=object))
    ('9', '10')
    """
    uniq = {str(v) for v in values if v is not None}
    try:
        return tuple(sorted(uniq, key=float))
    except ValueError:
        return tuple(sorted(uniq))


def storage_type(series: pd.Series, na_values: Sequence[str]) -> str:
    """The type a column's storage suggests (only used when the configuration says nothing)."""
    if pd.api.types.is_bool_dtype(series.dtype):
        return "binary"
    if pd.api.types.is_numeric_dtype(series.dtype):
        return "numeric"
    text = tokens(series, na_values)
    present = [t for t in text if t is not None]
    if present and pd.to_numeric(pd.Series(present, dtype=object), errors="coerce").notna().all():
        return "numeric"
    return "categorical"


MAX_LEVELS = 50  # more distinct text values than this: `drop` (an identifier, names, dates, free text)


def file_type(series: pd.Series, na_values: Sequence[str] = ()) -> tuple[str, str, str]:
    """The file's own type of a column, read exactly (numeric, binary, categorical or drop), why,
    and the rule that decided it (``empty``, ``one``, ``identifier``, ``many``: drops; ``numeric``;
    ``levels``): ``raco data describe``'s rule, and what a ``private`` type is under
    ``privacy.scope=paper`` (empirical).  Not for scope=model: one row can flip it (docs/privacy.md,
    "The schema")."""
    n = len(series)
    text = tokens(series, na_values)
    present = [t for t in text if t is not None]
    distinct = sorted_levels(text)
    kind = storage_type(series, na_values)
    if not present:
        return "drop", f"empty: no value in {n} rows", "empty"
    if len(distinct) == 1:
        return "drop", f"one value only in {n} rows", "one"
    if len(distinct) == len(present) and len(present) >= 20:
        values = pd.to_numeric(pd.Series(present, dtype=object), errors="coerce")
        if kind != "numeric" or (values.notna().all() and np.all(np.mod(values.to_numpy(dtype=np.float64), 1) == 0)):
            return "drop", f"identifier-like: {len(distinct)} distinct values in {len(present)} rows", "identifier"
    if kind == "numeric":
        return "numeric", "", "numeric"
    if len(distinct) > MAX_LEVELS:
        return "drop", f"{len(distinct)} distinct values in {n} rows (names, dates or free text?)", "many"
    return ("binary" if len(distinct) == 2 else "categorical"), f"{len(distinct)} levels", "levels"


# --- the loader ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """What a run must estimate privately (``private`` values of the configuration, under
    public or dp preprocessing) before the rows can be encoded (:mod:`raco_cli.privacy.estimates`).

    Attributes:
        bounds: numeric column -> the public transform of its estimated bounds.
        levels: categorical / binary feature columns whose level list is estimated.
        label: whether the label's classes are estimated.
        sensitive: sensitive columns whose level list is estimated.
        indicators: the candidate columns of a private ``missing_indicator`` (None: not private).
        types: feature columns whose type (numeric, categorical, binary, drop) is decided by
            the release, with their bounds or level list (``dataset.options.types.<col>: private``).
    """

    bounds: Mapping[str, str] = field(default_factory=dict)
    levels: tuple[str, ...] = ()
    label: bool = False
    sensitive: tuple[str, ...] = ()
    indicators: tuple[str, ...] | None = None
    types: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.bounds or self.levels or self.label or self.sensitive or self.indicators is not None or self.types)


@dataclass(frozen=True)
class PendingColumn:
    """The training-split cells of one column the private estimates read.

    ``kind``: ``bounds`` (``values`` float64, NaN = missing), ``levels`` (``values`` tokens,
    None = missing), ``type`` (``values`` tokens: a private type, decided with the bounds or
    levels from the same cells) or ``missing`` (``values`` bool, True = missing: the column is only a
    candidate of a private ``missing_indicator``).  ``indicator``: its missing count decides
    a ``<col>=missing`` feature.
    """

    name: str
    kind: str
    values: np.ndarray
    indicator: bool = False
    transform: str = "none"


@dataclass(frozen=True)
class Draft:
    """A table resolved against its configuration, its private values not yet estimated."""

    schema: TableSchema  # the pending parts are empty (no levels, no bound)
    pending: Pending
    dropped: Mapping[str, int]
    kept: np.ndarray  # the file's rows kept before the split
    public: bool
    where: str
    other: bool = True  # dataset.options.unknown=other (a binary column estimated with other than two levels)


def load(
    *,
    path: str | Sequence[str] | None = None,
    label: str | None = None,
    positive: object = None,
    threshold: float | None = None,
    sensitive: str | Sequence[str] | None = None,
    features: Sequence[str] | None = None,
    types: Mapping[str, str] = _EMPTY,
    levels: Mapping[str, object] = _EMPTY,
    missing: str = "impute",
    missing_indicator: object = None,
    unknown: str = "other",
    na_values: Sequence[str] = (),
    class_names: Sequence[str] | None = None,
    delimiter: str | None = None,
    name: str | None = None,
    split_seed: int = 0,
    split: str = "stratified",
    preprocessing: str = "empirical",
    bounds: Mapping[str, object] | None = None,
) -> TabularData:
    """Load a user's table as :class:`TabularData` (module docstring).

    ``private`` values (:mod:`raco_cli.data.provenance`) under public preprocessing are
    estimated per run: the data returned then has the split but no features yet
    (``meta["pending"]``), and :func:`finish` encodes it once the estimates are released
    (:func:`raco_cli.run.prepare.prepare_run`).  Under empirical preprocessing (the paper's
    protocol) they are read from the data, as missing values are.

    Raises:
        ConfigError: an option is malformed, names a column the file lacks, or the public
            description (bounds, level lists) is incomplete under public preprocessing.
        DataNotFoundError / DataIntegrityError: the file is missing or unreadable.
    """
    if path is None or path == "":
        raise ConfigError("dataset.options.path is not set; give your CSV (plain or .gz) or Parquet file, e.g. "
                          "dataset.options.path=people.csv (docs/your-own-data.md).")
    if not isinstance(label, str) or not label:
        raise ConfigError(f"dataset.options.label must be the name of the label column (got dataset.options.label={label!r}).")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"dataset.options.name must be a non-empty string or null (got dataset.options.name={name!r}); "
                          "the table's name in run names and summary.json (null: the file's stem).")
    na = (na_values,) if isinstance(na_values, str) else tuple(str(v) for v in (na_values or ()))
    df = read_table(path, na_values=na, delimiter=delimiter)
    public = preprocessing == "public"
    draft = resolve(
        df, label=label, positive=positive, threshold=threshold, sensitive=sensitive, features=features, types=types,
        levels=levels, missing=missing, missing_indicator=missing_indicator, unknown=unknown, na_values=na,
        class_names=class_names, public=public, bounds=bounds, where=_where(path),
    )
    kept = draft.kept
    if len(kept) < MIN_ROWS:
        reasons = "; ".join(f"{k}: {v}" for k, v in draft.dropped.items()) or "none"
        raise DataIntegrityError(f"{_where(path)}: {len(kept)} of {len(df)} rows are usable, at least {MIN_ROWS} are needed "
                                 f"(rows dropped: {reasons}); compare dataset.options.levels of the label and the sensitive "
                                 "columns with the values the file holds (raco data describe FILE lists them).")
    table = df.iloc[kept].reset_index(drop=True)
    y, class_names_, group, group_names = _split_keys(draft, table, na)
    # the label cell as its class name only when the classes are configuration (public); while its
    # levels are still to be estimated the interim class indices depend on every row's value
    named = None if draft.pending.label else label
    splits = split_rows(y, group, seed=split_seed, how=split, frame=_hashed_cells(table, named, y, class_names_))
    data = TabularData(
        name="table", X=np.zeros((len(y), 0), dtype=np.float32), y=y, group=group, feature_names=(), class_names=class_names_,
        group_names=group_names, splits=splits, source=_where(path),
        meta={"preprocessing": "public" if public else "empirical", "numeric_features": 0, "draft": draft, "frame": df,
              "file_rows": kept, "rows_read": len(df), "dropped": dict(draft.dropped), "pending": draft.pending.any},
    )
    return finish(data) if not draft.pending.any else data


def _hashed_cells(table: pd.DataFrame, label: str | None, y: np.ndarray, class_names: Sequence[str]) -> pd.DataFrame:
    """The cells a row's per-record split hashes: its own, the label's (``label``: None leaves it
    as it is) as its configured class name (so Adult read through dataset=table, label "Yes"/"No"
    named ">50K"/"<=50K", splits as dataset=adult does; a regression target stays its value)."""
    if label is None or label not in table.columns or len(class_names) < 2:
        return table
    hashed = table.copy()
    hashed[label] = np.asarray(class_names, dtype=object)[np.asarray(y)]
    return hashed


def _split_keys(draft: Draft, table: pd.DataFrame, na: tuple[str, ...]) -> tuple[np.ndarray, tuple[str, ...], np.ndarray, tuple[str, ...]]:
    """Classes and groups to stratify the split by: the final ones, or, where the label's or
    a sensitive column's levels are still to be estimated, every value of the kept rows
    (names withheld: they are data, used for the split only)."""
    schema = draft.schema
    if draft.pending.label:
        raw = tokens(table[schema.target.column], na)
        lv = sorted_levels(raw)
        index = {v: i for i, v in enumerate(lv)}
        y = np.array([index[t] for t in raw], dtype=np.int64)
        class_names: tuple[str, ...] = tuple(f"?{i}" for i in range(len(lv)))
    else:
        y, _, _ = schema.target.classes(table, na_values=na)
        class_names = schema.target.class_names
    if draft.pending.sensitive:
        lists = tuple(lv if col not in draft.pending.sensitive else sorted_levels(tokens(table[col], na))
                      for col, lv in zip(schema.groups.columns, schema.groups.levels))
        raw_groups = Groups(schema.groups.columns, lists)
        group, _, _ = raw_groups.index(table, na_values=na)
        group_names: tuple[str, ...] = tuple(f"?{i}" for i in range(len(raw_groups.names)))
    else:
        group, _, _ = schema.groups.index(table, na_values=na)
        group_names = schema.groups.names
    return y, class_names, group, group_names


def finish(data: TabularData, estimates: Estimates | None = None) -> TabularData:
    """Encode a loaded table: its private values filled in from ``estimates`` (released by
    :mod:`raco_cli.privacy.estimates` from the training split), rows whose label or group
    is outside an estimated level list dropped from every split, then the features fitted
    (public bounds, or the training part's statistics) and encoded.

    Raises:
        ConfigError: an estimated label keeps fewer than two classes, or the estimated
            groups none (one line naming the key and the way out).
    """
    meta: dict[str, Any] = dict(data.meta)
    draft: Draft = meta.pop("draft")
    frame: pd.DataFrame = meta.pop("frame")
    meta.pop("pending", None)
    na, where, pending = draft.schema.na_values, draft.where, draft.pending
    if pending.any and estimates is None:
        raise ValueError("the table's private values are not estimated yet (raco_cli.privacy.estimates)")
    schema = _filled(draft, estimates) if pending.any else draft.schema
    rows = np.asarray(meta["file_rows"])
    table = frame.iloc[rows].reset_index(drop=True)
    y, _, _ = schema.target.classes(table, na_values=na)
    group, _, _ = schema.groups.index(table, na_values=na)
    splits = {s: np.asarray(v) for s, v in data.splits.items()}
    keep = (y >= 0) & (group >= 0)
    dropped = dict(meta.get("dropped", {}))
    if not keep.all():  # a value outside an estimated level list: post-processing of the release
        if pending.label and (y < 0).any():
            dropped["label not in its estimated level list"] = int((y < 0).sum())
        if pending.sensitive and (group < 0).any():
            dropped["sensitive value not in its estimated level list"] = int(((group < 0) & (y >= 0)).sum())
        new_index = np.cumsum(keep) - 1
        splits = {s: new_index[idx[keep[idx]]] for s, idx in splits.items()}
        empty = [s for s, idx in splits.items() if len(idx) == 0]
        if empty:
            raise DataIntegrityError(f"{where}: no row of the {empty[0]} split has a label and group in the estimated level lists; "
                                     "declare the level lists of the label and the sensitive columns public.")
        rows, table, y, group = rows[keep], table[keep].reset_index(drop=True), y[keep], group[keep]
    schema = fit(schema, table, splits["train"], na_values=na, public=draft.public, where=where)
    encoded = schema.encoder.encode(table, na_values=na, where=where)
    repairs = {
        split: {col: {kind: int(mask[idx].sum()) for kind, mask in kinds.items() if mask[idx].any()}
                for col, kinds in encoded.masks.items() if any(mask[idx].any() for mask in kinds.values())}
        for split, idx in splits.items()
    }
    meta.update({
        # the first len(numeric) columns of X are the numeric features: dataset.preprocessing=dp
        # standardises them privately after loading (raco_cli/privacy/preprocessing.py)
        "numeric_features": len(schema.encoder.numeric),
        "schema": schema,
        "dropped": {k: v for k, v in dropped.items() if v},
        "repairs": repairs,
        "file_rows": rows,
        # (n, m) missing numeric cells: imputed at the public midpoint here, then at the DP
        # mean by dataset.preprocessing=dp (raco_cli.privacy.preprocessing.scale_rows)
        "numeric_missing": np.stack([encoded.masks[c.name]["missing"] for c in schema.encoder.numeric], axis=1)
        if schema.encoder.numeric else np.zeros((len(y), 0), dtype=bool),
        "label": schema.target.column,
        "sensitive": "&".join(schema.groups.columns),
    })
    if estimates is not None:
        meta["estimates"] = estimates.to_dict()
    return TabularData(
        name="table",
        X=encoded.X,
        y=y,
        group=group,
        feature_names=schema.encoder.feature_names,
        class_names=schema.target.class_names,
        group_names=schema.groups.names,
        splits=splits,
        source=data.source,
        meta=meta,
    )


def _filled(draft: Draft, est: Estimates | None) -> TableSchema:
    """The draft's schema with its private values taken from the estimates."""
    assert est is not None
    schema, pending = draft.schema, draft.pending
    target = schema.target
    if pending.label:
        classes = est.levels.get(target.column, ())
        if not classes:
            raise ConfigError(f"dataset.options.levels.{target.column} is private and its estimate kept no class: a class needs "
                              f"about {est.threshold:.0f} training rows to be released; declare the classes public "
                              f"(dataset.options.levels.{target.column}=[...]) or set dataset.options.positive.")
        if len(classes) == 1:  # one class released: every other value is the second class (post-processing)
            target = Target(target.column, "rest", (classes[0], rest_name(classes[0])), levels=classes)
        else:
            target = Target(target.column, "levels", classes, levels=classes)
    lists, rest = [], []
    for col, lv in zip(schema.groups.columns, schema.groups.levels):
        other = False
        if col in pending.sensitive:
            lv = est.levels.get(col, ())
            if not lv:
                raise ConfigError(f"dataset.options.levels.{col} is private and its estimate kept no group: a group needs about "
                                  f"{est.threshold:.0f} training rows to be released; declare the groups public "
                                  f"(dataset.options.levels.{col}=[...]).")
            if len(lv) == 1:  # one group released: the rest of the rows form a second group (post-processing)
                lv, other = (lv[0], rest_name(lv[0])), True
        lists.append(lv)
        rest.append(other)
    private_lists = ([target.column] if pending.label else []) + list(pending.sensitive)
    if private_lists:  # the constraint's classes and groups come from the release: say which
        named = {target.column: target.class_names} if pending.label else {}
        named.update({c: lv for c, lv in zip(schema.groups.columns, lists) if c in pending.sensitive})
        # one line (docs/your-own-data.md "Where a value comes from" says the rest): a rare class or group is not
        # released, so its rows are left out (or form 'not <kept>'); the user may know a public list
        log.warning("the private estimate released %s (each needs ~%.0f training rows; rarer ones are left out or merged into "
                    "'not <kept>'; a public list keeps them)",
                    "; ".join(f"the {'classes' if c == target.column else 'groups'} of {c}: {', '.join(named[c])}"
                              for c in private_lists), est.threshold)
    indicators = set(est.indicators) if pending.indicators is not None else set()
    cols: list[Column] = []
    for c in schema.encoder.columns:
        ind = c.indicator or c.name in indicators
        if c.name in pending.types:  # the type the release decided (raco_cli.privacy.estimates.decide_type)
            kind, lv = est.types.get(c.name, "drop"), est.levels.get(c.name, ())
            if kind == "numeric":
                lo, hi = est.bounds[c.name]
                cols.append(NumericColumn(c.name, bound=PublicBound(lo, hi), indicator=ind, text_as_missing=True))
            elif kind == "binary" and len(lv) == 2:
                cols.append(BinaryColumn(c.name, (lv[0], lv[1]), indicator=ind))
            elif kind in ("binary", "categorical"):
                cols.append(CategoricalColumn(c.name, lv, other=draft.other, indicator=ind))
            continue  # drop
        if isinstance(c, NumericColumn):
            if c.name in pending.bounds:
                lo, hi = est.bounds[c.name]
                c = NumericColumn(c.name, bound=PublicBound(lo, hi, pending.bounds[c.name]))
            cols.append(replace(c, indicator=ind))
        elif c.name in pending.levels:
            lv = est.levels.get(c.name, ())
            if isinstance(c, BinaryColumn) and len(lv) == 2:
                cols.append(BinaryColumn(c.name, (lv[0], lv[1]), indicator=ind))
            else:  # binary needs exactly two released levels; otherwise one-hot over those released
                cols.append(CategoricalColumn(c.name, lv, other=draft.other, indicator=ind))
        else:
            cols.append(replace(c, indicator=ind))
    if not cols:
        raise ConfigError(f"every feature column was estimated `drop` (dataset.options.types: {', '.join(pending.types)} private): "
                          "too few training rows hold a value each needs released (~"
                          f"{est.threshold:.0f}); declare the types and their bounds or levels public.")
    return TableSchema(target, Groups(schema.groups.columns, tuple(lists), tuple(rest)), TableEncoder(tuple(cols)), schema.na_values)


def rest_name(released: str) -> str:
    """The name of the class or group of every value but the one released: ``not <value>``.

    >>> rest_name('no')
    'not no'
    """
    return f"not {released}"


def pending_values(data: TabularData, rows: np.ndarray) -> list[PendingColumn]:
    """The cells of ``rows`` (indices into ``data``, e.g. its training split) of every column
    whose value is to be estimated, in the file's column order: what the private estimates
    read (:mod:`raco_cli.privacy.estimates`), and nothing else."""
    draft = cast(Draft, data.meta["draft"])
    frame = cast(pd.DataFrame, data.meta["frame"])
    pending, na = draft.pending, draft.schema.na_values
    part = frame.iloc[np.asarray(data.meta["file_rows"])[np.asarray(rows)]]
    candidates = set(pending.indicators or ())
    level_cols = set(pending.levels) | set(pending.sensitive) | ({draft.schema.target.column} if pending.label else set())
    out: list[PendingColumn] = []
    for col in map(str, frame.columns):
        ind = col in candidates
        if col in pending.bounds:
            out.append(PendingColumn(col, "bounds", numbers(part[col], column=col, where=draft.where, na_values=na), ind,
                                     pending.bounds[col]))
        elif col in pending.types:
            out.append(PendingColumn(col, "type", tokens(part[col], na), ind))
        elif col in level_cols:
            out.append(PendingColumn(col, "levels", tokens(part[col], na), ind))
        elif ind:
            out.append(PendingColumn(col, "missing", np.array([t is None for t in tokens(part[col], na)], dtype=bool), True))
    return out


def _where(path: str | Sequence[str]) -> str:
    return str(path) if isinstance(path, (str, Path)) else ", ".join(str(p) for p in path)


def resolve(
    df: pd.DataFrame,
    *,
    label: str,
    positive: object,
    threshold: float | None,
    sensitive: str | Sequence[str] | None,
    features: Sequence[str] | None,
    types: Mapping[str, str],
    levels: Mapping[str, object],
    missing: str,
    missing_indicator: object,
    unknown: str,
    na_values: tuple[str, ...],
    class_names: Sequence[str] | None,
    public: bool,
    bounds: Mapping[str, object] | None,
    where: str = "the table",
) -> Draft:
    """Options + file -> the draft: the schema (features not fitted yet, private values
    pending), the dropped-row counts by reason, and the indices of the kept rows."""
    columns = [str(c) for c in df.columns]
    available = ", ".join(columns[:20]) + (", ..." if len(columns) > 20 else "")

    def check(names: Sequence[str], key: str) -> None:
        for name in names:
            if name not in columns:
                raise ConfigError(f"{key} names the column {name!r}, which the file lacks. Columns: {available}.")

    check([label], "dataset.options.label")
    sens = _names(sensitive, "dataset.options.sensitive")
    if not sens:
        raise ConfigError("dataset.options.sensitive is not set; give the sensitive column (or a list of columns for "
                          "intersectional groups), e.g. dataset.options.sensitive=[sex].")
    check(sens, "dataset.options.sensitive")
    if label in sens:
        raise ConfigError(f"dataset.options.sensitive must not contain the label column {label!r}.")
    for key, mapping in (("dataset.options.types", types), ("dataset.options.levels", levels), ("dataset.bounds", bounds)):
        if mapping is not None and not isinstance(mapping, Mapping):
            raise ConfigError(f"{key} must be a mapping column -> value (got {key}={mapping!r}).")
        check(list(mapping or {}), key)
    level_entries = {str(c): provenance.levels(v, f"dataset.options.levels.{c}") for c, v in dict(levels or {}).items()}
    bound_entries = {str(c): provenance.bound(v, f"dataset.bounds.{c}") for c, v in dict(bounds or {}).items()}
    ind_entry = provenance.indicators(missing_indicator)
    type_entries = {str(c): provenance.column_type(v, f"dataset.options.types.{c}") for c, v in dict(types or {}).items()}
    # a private type is decided with the column's bounds or levels from noisy counts (public preprocessing),
    # read from the file's storage under empirical (the paper's protocol)
    private_types = {c for c, e in type_entries.items() if e.private}
    types = {c: e.value for c, e in type_entries.items() if not e.private}
    if private_types and not public:  # the paper's protocol: the file's own types, as `raco data describe` reads them
        types.update({c: file_type(df[c], na_values)[0] for c in private_types if c in columns})
        private_types = set()
    # private values: pending under public preprocessing, read from the data under empirical (the paper's protocol)
    private_levels = {c for c, e in level_entries.items() if e.private}
    private_bounds = {c: e.transform for c, e in bound_entries.items() if e.private}
    plain_levels = {c: e.value for c, e in level_entries.items() if not e.private}
    raw_bounds = {c: e.value for c, e in bound_entries.items() if not e.private}
    for col in type_entries:
        if col == label or col in sens:
            raise ConfigError(f"dataset.options.types.{col}: {col} is the label or a sensitive column; types apply to features.")
    if missing not in MISSING_RULES:
        raise ConfigError(f"dataset.options.missing must be one of {', '.join(MISSING_RULES)} (got {missing!r}); "
                          "impute: fill and count, drop: drop the row and count it.")
    if unknown not in UNKNOWN_RULES:
        raise ConfigError(f"dataset.options.unknown must be one of {', '.join(UNKNOWN_RULES)} (got {unknown!r}); "
                          "other: a <col>=other feature, zero: no level column set.")
    if features is None:
        feats = tuple(c for c in columns if c != label and c not in sens and types.get(c) != "drop")
    else:
        feats = _names(features, "dataset.options.features")
        check(feats, "dataset.options.features")
        if label in feats:
            raise ConfigError(f"dataset.options.features must not contain the label column {label!r}.")
        feats = tuple(c for c in feats if types.get(c) != "drop")
    if not feats:
        raise ConfigError("No feature columns: dataset.options.features is empty or every column is dropped.")
    if ind_entry.private:
        indicators: tuple[str, ...] = ()
    else:
        indicators = _names(list(ind_entry.value or ()), "dataset.options.missing_indicator")
        check(indicators, "dataset.options.missing_indicator")
        stray = [c for c in indicators if c not in feats]
        if stray:
            raise ConfigError(f"dataset.options.missing_indicator names {stray[0]!r}, which is not a feature column"
                              + (" (its type is drop)" if types.get(stray[0]) == "drop" else "") + "; remove it from the list.")
    if class_names is not None and label in private_levels and positive is None and threshold is None and public:
        raise ConfigError(f"dataset.options.class_names needs the classes of {label!r} in a public list; "
                          f"dataset.options.levels.{label} is private (estimated): remove class_names or declare the classes.")
    label_pending = public and label in private_levels and positive is None and threshold is None
    target = _target(df, label, positive, threshold, plain_levels, class_names, na_values, public and not label_pending,
                     pending=label_pending)
    sens_pending = tuple(c for c in sens if c in private_levels) if public else ()
    groups = _groups(df, sens, plain_levels, na_values, public, pending=sens_pending)
    levelled = set(plain_levels) | private_levels
    bounded = set(raw_bounds) | set(private_bounds)
    both = [c for c in feats if c in bounded and c in levelled and c not in types]
    if both:
        raise ConfigError(f"dataset.bounds.{both[0]} and dataset.options.levels.{both[0]} are both set: a column is numeric "
                          f"(bounds) or categorical (levels); remove one, or declare dataset.options.types.{both[0]}.")
    for col in private_types & (bounded | levelled):
        which = f"dataset.bounds.{col}" if col in bounded else f"dataset.options.levels.{col}"
        raise ConfigError(f"dataset.options.types.{col} is private and {which} is set: a private type is estimated together "
                          f"with the column's bounds or levels; remove {which}, or declare the type (e.g. "
                          f"dataset.options.types.{col}={'numeric' if col in bounded else 'categorical'}).")
    resolved_types = {c: PRIVATE_TYPE if public and c in private_types else types.get(c) or (
        "numeric" if c in bounded else "categorical" if c in levelled else storage_type(df[c], na_values)) for c in feats}
    for col, t in resolved_types.items():
        if t == "numeric" and col in levelled:
            raise ConfigError(f"dataset.options.levels.{col} is set, but {col} is numeric; declare "
                              f"dataset.options.types.{col}=categorical or remove the level list.")
        if t != "numeric" and col in bounded:
            raise ConfigError(f"dataset.bounds.{col} is set, but {col} is {t}; bounds apply to numeric columns.")
    stray_bounds = [c for c in bounded if c not in feats]
    if stray_bounds:
        raise ConfigError(f"dataset.bounds.{stray_bounds[0]} names no feature column; remove it or add the column to the features.")
    if public:
        _require_public(resolved_types, bounded, levelled, "dataset.preprocessing=public/dp (privacy.scope=model)")
    parsed = parse_bounds(raw_bounds, dataset="table") if public else {}
    if ind_entry.private and not public:  # the paper's protocol: every feature column with a missing value in the file
        indicators = tuple(c for c in feats if any(t is None for t in tokens(df[c], na_values)))
    cols: list[Column] = []
    for col, t in resolved_types.items():
        ind = col in indicators
        if t == "numeric":
            cols.append(NumericColumn(col, bound=parsed.get(col), indicator=ind))
            continue
        lv = _levels_of(plain_levels[col], f"dataset.options.levels.{col}", df[col]) if col in plain_levels else ()
        if t == PRIVATE_TYPE:  # a placeholder: numeric, categorical, binary or dropped by the release (_filled)
            cols.append(CategoricalColumn(col, (), other=unknown == "other", indicator=ind))
            continue
        if t == "binary":
            if lv and len(lv) != 2:
                raise ConfigError(f"dataset.options.levels.{col} must list exactly 2 values for a binary column (got {list(lv)}).")
            cols.append(BinaryColumn(col, lv, indicator=ind))  # type: ignore[arg-type]
        else:
            cols.append(CategoricalColumn(col, lv, other=unknown == "other", indicator=ind))
    pending = Pending(
        bounds={c: private_bounds[c] for c in feats if c in private_bounds} if public else {},
        levels=tuple(c for c in feats if c in private_levels and resolved_types[c] != "numeric") if public else (),
        types=tuple(c for c in feats if resolved_types[c] == PRIVATE_TYPE),
        label=label_pending, sensitive=sens_pending,
        indicators=feats if ind_entry.private and public else None,
    )
    schema = TableSchema(target=target, groups=groups, encoder=TableEncoder(tuple(cols)), na_values=na_values)

    if label_pending:  # classes not known yet: a row without a label has no class; the others wait for the estimate
        y_missing = np.array([t is None for t in tokens(df[label], na_values)], dtype=bool)
        y_unknown = np.zeros(len(df), dtype=bool)
    else:
        _, y_missing, y_unknown = target.classes(df, na_values=na_values, where=where)
    g_missing, g_unknown = np.zeros(len(df), dtype=bool), np.zeros(len(df), dtype=bool)
    for col, lv in zip(groups.columns, groups.levels):
        text = tokens(df[col], na_values)
        miss = np.array([t is None for t in text], dtype=bool)
        g_missing |= miss
        if col not in sens_pending:
            g_unknown |= ~miss & ~member(text, lv)
    dropped = {"label missing": int(y_missing.sum()), "label not in its level list": int(y_unknown.sum()),
               "sensitive value missing": int(g_missing.sum()), "sensitive value not in its level list": int(g_unknown.sum())}
    keep = ~(y_missing | y_unknown | g_missing | g_unknown)
    feature_missing = np.zeros(len(df), dtype=bool)
    for c in cols:  # numeric cells are checked here, over the whole file: errors name the file's row
        if isinstance(c, NumericColumn):
            feature_missing |= np.isnan(numbers(df[c.name], column=c.name, where=where, na_values=na_values))
        else:
            feature_missing |= np.array([t is None for t in tokens(df[c.name], na_values)], dtype=bool)
    if missing == "drop":
        dropped["feature missing (missing: drop)"] = int((feature_missing & keep).sum())
        keep &= ~feature_missing
    dropped = {k: v for k, v in dropped.items() if v}
    return Draft(schema=schema, pending=pending, dropped=dropped, kept=np.flatnonzero(keep), public=public, where=where,
                 other=unknown == "other")


def _target(df, label, positive, threshold, levels, class_names, na_values, public, *, pending: bool = False) -> Target:
    """The label rule; a positive value or a class of the level list that the label column
    never holds is an error naming the values it holds (a typo must not train to a constant).
    ``pending``: the classes are estimated privately later (:func:`finish`)."""
    if positive is not None and threshold is not None:
        raise ConfigError("dataset.options.positive and dataset.options.threshold are both set; give one "
                          "(positive: label values of class 1; threshold: class 1 when the label is above it).")
    present = set(tokens(df[label], na_values)) - {None}
    if positive is not None:
        pos = _levels_of(positive if isinstance(positive, (list, tuple)) else [positive], "dataset.options.positive", df[label])
        absent = [v for v in pos if v not in present]
        if absent:
            raise ConfigError(f"dataset.options.positive={absent[0]} does not occur in the label column {label!r} (its values: "
                              f"{_values_in(df, label, na_values)}); values are compared as text, case-sensitive: give one of them.")
        joined = "|".join(pos)
        target = Target(label, "positive", (f"not {joined}", joined), positive=pos)
    elif threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not np.isfinite(threshold):
            raise ConfigError(f"dataset.options.threshold must be a finite number (got dataset.options.threshold={threshold!r}).")
        target = Target(label, "threshold", (f"<= {threshold:g}", f"> {threshold:g}"), threshold=float(threshold))
    elif pending:
        return Target(label, "levels", ())
    else:
        if label in levels:
            lv = _levels_of(levels[label], f"dataset.options.levels.{label}", df[label])
            absent = [v for v in lv if v not in present]
            if absent:
                raise ConfigError(f"dataset.options.levels.{label} lists the class {absent[0]!r}, which the label column never "
                                  f"holds (its values: {_values_in(df, label, na_values)}); values are compared as text, "
                                  "case-sensitive: list the classes the file holds.")
        elif public:
            raise ConfigError(f"dataset.options.levels.{label} is missing: under privacy.scope=model the classes of the label "
                              f"need a public list (e.g. levels: {{{label}: ['no', 'yes']}}) or `private` (estimated inside eps), "
                              f"or set dataset.options.positive / dataset.options.threshold; {SCOPE_HINT}.")
        else:
            lv = sorted_levels(tokens(df[label], na_values))
        if len(lv) < 2:
            raise ConfigError(f"The label {label!r} has {len(lv)} class(es) {list(lv)}; at least 2 are needed "
                              f"(dataset.options.levels.{label}, positive or threshold).")
        target = Target(label, "levels", lv, levels=lv)
    if class_names is not None:
        names = tuple(str(c) for c in class_names) if isinstance(class_names, (list, tuple)) else ()
        if len(names) != len(target.class_names) or len(set(names)) != len(names):
            raise ConfigError(f"dataset.options.class_names must list {len(target.class_names)} distinct names, one per class "
                              f"(got {class_names!r}; classes: {list(target.class_names)}).")
        target = Target(target.column, target.rule, names, target.levels, target.positive, target.threshold)
    return target


def _groups(df, sens, levels, na_values, public, *, pending: tuple[str, ...] = ()) -> Groups:
    lists: list[tuple[str, ...]] = []
    for col in sens:
        if col in pending:
            lists.append(())  # estimated privately (finish)
        elif col in levels:
            lists.append(_levels_of(levels[col], f"dataset.options.levels.{col}", df[col]))
        elif public:
            raise ConfigError(f"dataset.options.levels.{col} is missing: under privacy.scope=model the sensitive groups need "
                              f"a public level list (e.g. levels: {{{col}: ['F', 'M']}}) or `private` (estimated inside eps); "
                              f"{SCOPE_HINT}.")
        else:
            lists.append(sorted_levels(tokens(df[col], na_values)))
    return Groups(sens, tuple(lists))


def _require_public(resolved_types: Mapping[str, str], bounded: set[str], levelled: set[str], why: str) -> None:
    no_bounds = [c for c, t in resolved_types.items() if t == "numeric" and c not in bounded]
    if no_bounds:
        raise ConfigError(f"dataset.bounds.{no_bounds[0]} is missing: {why} needs public bounds [lo, hi] (or `private`, estimated "
                          f"inside eps) for every numeric column ({', '.join(no_bounds)}); {SCOPE_HINT}.")
    no_levels = [c for c, t in resolved_types.items() if t in ("categorical", "binary") and c not in levelled]
    if no_levels:
        raise ConfigError(f"dataset.options.levels.{no_levels[0]} is missing: {why} needs a public level list (or `private`, "
                          f"estimated inside eps) for every categorical or binary column ({', '.join(no_levels)}); {SCOPE_HINT}.")


def fit(schema: TableSchema, table: pd.DataFrame, train: np.ndarray, *, na_values: tuple[str, ...], public: bool,
        where: str = "the table") -> TableSchema:
    """Complete the feature encoders: public bounds (already in the schema), or (empirical)
    the training part's mean/std and the level lists the configuration left open."""
    cols: list[Column] = []
    part = table.iloc[train]
    for c in schema.encoder.columns:
        if isinstance(c, NumericColumn):
            if public:
                assert c.bound is not None, c.name
                cols.append(c)
            else:
                values = pd.Series(numbers(part[c.name], column=c.name, where=where, na_values=na_values))
                mean, std = float(values.mean()), float(values.std(ddof=0))
                cols.append(NumericColumn(c.name, mean=mean if np.isfinite(mean) else 0.0, std=std if np.isfinite(std) else 1.0,
                                          indicator=c.indicator))
        elif c.levels or public:  # public: a private list estimated empty (only <col>=other)
            cols.append(c)
        else:  # empirical only (_require_public): the level list of the training part
            lv = sorted_levels(tokens(part[c.name], na_values))
            if isinstance(c, BinaryColumn):
                if len(lv) != 2:
                    raise ConfigError(f"Column {c.name!r} is binary but its training part has {len(lv)} value(s) {list(lv)[:5]}; "
                                      f"declare dataset.options.levels.{c.name}=[<0 value>, <1 value>] or another type.")
                cols.append(BinaryColumn(c.name, (lv[0], lv[1]), indicator=c.indicator))
            else:
                cols.append(CategoricalColumn(c.name, lv, other=c.other, indicator=c.indicator))
    return TableSchema(schema.target, schema.groups, TableEncoder(tuple(cols)), schema.na_values)


# --- what the rules did -------------------------------------------------------------------


def format_counts(counts: Mapping[str, Mapping[str, int]]) -> str:
    """``{column: {rule: rows}}`` as one line.

    >>> format_counts({"age": {"missing": 2, "clipped": 1}, "city": {"unknown": 3}})
    'age: 2 missing (imputed), 1 outside the bounds (clipped); city: 3 unknown level'
    """
    words = {"missing": "missing (imputed)", "clipped": "outside the bounds (clipped)", "unknown": "unknown level"}
    return "; ".join(f"{col}: " + ", ".join(f"{n} {words[k]}" for k, n in kinds.items()) for col, kinds in counts.items())


def report_lines(data: TabularData, *, exact: bool) -> list[str]:
    """Log lines counting dropped rows and the missing / out-of-bound / unknown-level rules.

    ``exact=False`` (a private run under ``privacy.scope=model``): counts of training and
    validation rows are exact statistics, and so are the file's row count and the number of
    rows kept (they give n; under add/remove adjacency n is released only as a DP count,
    raco_cli/privacy/size.py): only the held-out test split's counts are given.
    """
    meta: Mapping[str, Any] = data.meta
    repairs: Mapping[str, Any] = meta.get("repairs", {})
    if not exact:
        lines = [f"dataset=table: read from {data.source}; {len(data.splits['test'])} rows in the held-out test split "
                 "(the file's row count, rows kept and dropped are exact statistics: logged only in privacy.scope=paper)"]
    else:
        n_read, dropped = int(meta.get("rows_read", len(data.y))), dict(meta.get("dropped", {}))
        total = n_read - len(data.y)
        lines = [f"dataset=table: {n_read} rows read from {data.source}; {len(data.y)} kept"
                 + (f", {total} dropped" if total else "")
                 + (" (" + ", ".join(f"{k}: {v}" for k, v in dropped.items()) + ")" if dropped else "")]
    for split in SPLITS if exact else ("test",):
        counts = repairs.get(split, {})
        if counts:
            lines.append(f"{split} split: {format_counts(counts)}")
        else:
            lines.append(f"{split} split: no missing, out-of-bound or unknown values")
    if not exact:
        lines.append("train/val counts of the missing, clipping and unknown-level rules are exact statistics: not logged "
                     "under privacy.scope=model")
    return lines
