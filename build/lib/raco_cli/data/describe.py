"""``raco data describe FILE``: a starting ``dataset=table`` config read from the file itself.

The YAML it prints extends ``conf/dataset/table.yaml`` (``defaults: [table, _self_]``), so
it is kept as ``<dir>/dataset/<name>.yaml`` and used with ``raco train --config-dir <dir>
dataset=<name>``; it trains as written under the default ``privacy.scope=model``:

* every feature column's type is ``private``: each run decides it (numeric, categorical,
  binary or drop) with the column's bounds or level list from noisy counts of its training
  split, inside its epsilon (:mod:`raco_cli.privacy.estimates`); so are the level lists of the
  label and the sensitive columns and the missing-value indicators.  A type read from the file
  exactly would hang on single records (one odd value turns ``drop`` into ``binary``, one
  duplicate turns an identifier into a feature) and reach every record of the run
  (docs/privacy.md "The schema").  What the file holds is shown in a comment, in the
  ``source: data`` form (:mod:`raco_cli.data.provenance`) for a user who wants to copy it and
  declare it public.  ``--values data`` writes those values instead (marked ``source: data``:
  for ``privacy.scope=paper``, which takes them; ``scope=model`` refuses them);
* the file's types (in the comments, or ``--values data``): numbers -> ``numeric``, two
  values -> ``binary``, text -> ``categorical``; ``drop`` for an empty column, a column holding
  one value, an identifier (every value distinct: text, or whole numbers such as a numeric
  id), text with more than :data:`MAX_LEVELS` values (names, dates, free text), and a second
  copy of a duplicated header with the same cells.  A second copy of a duplicated header is
  ``drop`` in the private config too: that is read from the header (public schema);
* comments flag what to review: a likely label leak (:func:`leak_accuracy`), a numeric
  column with a few non-numeric tokens (``--na-value`` suggested), a duplicated header;
* the delimiter is read from the header (``delimiter:`` written when it is not a comma).

Only the header (column names, the delimiter) is treated as public schema (docs/privacy.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from raco_cli.data.schema import numbers, tokens
from raco_cli.data.table import (
    MAX_LEVELS,
    duplicate_headers,
    file_type,
    header_line,
    read_table,
    sniff_delimiter,
    sorted_levels,
)
from raco_cli.errors import ConfigError

LEAK_ACCURACY = 0.95  # a column alone predicting the label at least this well on held-out rows...
LEAK_ERROR_SHARE = 0.25  # ...with at most this share of the majority class's errors is flagged
NA_SHARE = 0.9  # a text column whose cells are numbers but for at most NA_TOKENS tokens (>= this share of cells)
NA_TOKENS = 3
VALUES = ("private", "data")
NOTE = ("raco data describe: column types, bounds, level lists and missing-value indicators are written as `private` (each run "
        "estimates them inside its eps); the file's own values are in the comments and are NOT private (docs/privacy.md).")
NOTE_DATA = ("raco data describe --values data: the column types, bounds, level lists and missing-value indicators below are the "
             "file's own, "
             "marked source: data; they are NOT private: privacy.scope=model refuses them, train with privacy.scope=paper.")


def _quote(value: object) -> str:
    """A YAML scalar that stays a string (``'no'``, ``'1.10'``), in single quotes.

    >>> _quote("no"), _quote("O'Hara"), _quote(3)
    ("'no'", "'O''Hara'", '3')
    """
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return _flow(value)


def _list(values: Sequence[object]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def _flow(value: object) -> str:
    """A YAML value on one line (``[a, b]``, quoted where YAML needs it)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).strip().removesuffix("...").strip()


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


@dataclass
class Column:
    """What describe found about one column."""

    name: str
    type: str  # numeric | categorical | binary | drop
    note: str
    levels: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None
    missing: int = 0
    review: list[str] = field(default_factory=list)
    header_copy: bool = False  # a second copy of a duplicated header name (public: read from the header)


def leak_accuracy(values: np.ndarray, y: np.ndarray, *, numeric: bool, seed: int = 0) -> tuple[float, float]:
    """How well one column alone predicts the label on held-out rows: ``(accuracy, majority)``.

    The labelled rows are split in two halves at random (``seed``); on the first, each value
    of the column (numeric: each of 20 quantile bins of the first half; a missing cell: its
    own value) predicts its most frequent label (unseen values: the overall most frequent);
    the accuracy is measured on the second half, beside that of always predicting the first
    half's most frequent label.

    >>> x = np.arange(200.0); y = (x > 99).astype(int)
    >>> leak_accuracy(x, y, numeric=True)[0] > 0.95, leak_accuracy(np.random.default_rng(0).random(200), y, numeric=True)[0] < 0.8
    (True, True)
    """
    n = len(y)
    order = np.random.default_rng(seed).permutation(n)
    fit, held = order[: n // 2], order[n // 2:]
    if numeric:
        v = np.asarray(values, dtype=np.float64)
        present = v[fit][~np.isnan(v[fit])]
        edges = np.unique(np.quantile(present, np.linspace(0, 1, 21)[1:-1])) if len(present) else np.array([])
        keys = np.where(np.isnan(v), -1, np.searchsorted(edges, np.where(np.isnan(v), 0.0, v), side="right"))
    else:
        keys = np.array(["\0missing" if t is None else t for t in values], dtype=object)
    overall = Counter(y[fit].tolist()).most_common(1)[0][0]
    by_key: dict[object, Counter] = {}
    for k, label in zip(keys[fit].tolist(), y[fit].tolist()):
        by_key.setdefault(k, Counter())[label] += 1
    guess = {k: c.most_common(1)[0][0] for k, c in by_key.items()}
    pred = np.array([guess.get(k, overall) for k in keys[held].tolist()])
    return float((pred == y[held]).mean()), float((y[held] == overall).mean())


def _label_classes(df: pd.DataFrame, label: str, na_values: Sequence[str]) -> np.ndarray | None:
    """The label of each row as a class index (-1: missing), or None for a numeric label with
    more than MAX_LEVELS values (its classes need a threshold)."""
    text = tokens(df[label], na_values)
    lv = sorted_levels(text)
    if len(lv) > MAX_LEVELS:
        return None
    index = {v: i for i, v in enumerate(lv)}
    return np.array([-1 if t is None else index[t] for t in text], dtype=np.int64)


def _column(df: pd.DataFrame, col: str, na_values: Sequence[str], y: np.ndarray | None, label: str,
            duplicates: dict[str, tuple[str, int, list[int]]]) -> Column:
    n = len(df)
    text = tokens(df[col], na_values)
    present = [t for t in text if t is not None]
    n_missing = n - len(present)
    distinct = sorted_levels(text)
    note = f"{n_missing} missing of {n}"
    review: list[str] = []
    if col in duplicates:
        original, nth, positions = duplicates[col]
        review.append(f"the header names {original!r} {len(positions)} times (positions {', '.join(map(str, positions))}); "
                      f"this is copy {nth}, read as {col!r}")
        if tokens(df[original], na_values).tolist() == text.tolist():
            return Column(col, "drop", f"identical to {original!r}", missing=n_missing, review=review, header_copy=True)
    kind, why, rule = file_type(df[col], na_values)
    if rule in ("empty", "one", "identifier"):
        return Column(col, "drop", why, missing=n_missing, review=review)
    if kind == "numeric":
        values = numbers(df[col], column=col, where="the file", na_values=na_values)
        found = values[~np.isnan(values)]
        lo, hi = float(found.min()), float(found.max())
        if (lo > 0 or hi < 0) and hi - lo < max(abs(lo), abs(hi)) / 4:
            review.append(f"narrow range far from 0 ({_number(lo)} to {_number(hi)}): private bounds are whole octaves (powers of 2) and "
                          "would be much wider; declare public bounds if you know them")
        column = Column(col, "numeric", note, bounds=(_number(lo), _number(hi)), missing=n_missing, review=review)
        leak_values: np.ndarray = values
    else:
        numeric = pd.to_numeric(pd.Series(present, dtype=object), errors="coerce")
        others = Counter(t for t, v in zip(present, numeric) if np.isnan(v))
        if numeric.notna().mean() >= NA_SHARE and len(others) <= NA_TOKENS:
            shown = ", ".join(f"{t!r} ({c} cells)" for t, c in others.most_common())
            flags = " ".join(f"--na-value {_quote(t)}" for t in others)
            review.append(f"numbers but for {shown}: if they mark missing values, describe again with {flags}")
        if rule == "many":
            return Column(col, "drop", why, missing=n_missing, review=review)
        column = Column(col, "binary" if len(distinct) == 2 else "categorical", f"{len(distinct)} levels, {note}",
                        levels=distinct, missing=n_missing, review=review)
        leak_values = text
    if y is not None:
        labelled = y >= 0
        if labelled.sum() >= 40:
            acc, majority = leak_accuracy(leak_values[labelled], y[labelled], numeric=column.type == "numeric")
            if acc >= LEAK_ACCURACY and (1 - acc) <= LEAK_ERROR_SHARE * (1 - majority):
                review.append(f"predicts {label} alone: accuracy {acc:.3f} on held-out rows (the most frequent class: {majority:.3f}); "
                              "a label leak? drop it if it is known only with or after the label")
    if col in duplicates:
        column.header_copy = True
    return column


def describe(path: str, *, label: str, sensitive: Sequence[str], na_values: Sequence[str] = (), values: str = "private",
             delimiter: str | None = None) -> tuple[str, list[str]]:
    """The YAML text of a starting config for the table at ``path`` (module docstring), and
    the lines to review (for stderr).

    Raises:
        ConfigError: the label or a sensitive column is not in the file.
        DataNotFoundError / DataIntegrityError: the file is missing or unreadable.
    """
    if values not in VALUES:
        raise ConfigError(f"--values must be one of {', '.join(VALUES)} (got {values!r}); private: estimated inside eps "
                          "(privacy.scope=model), data: the file's values (privacy.scope=paper).")
    df = read_table(path, na_values=na_values, key="raco data describe", delimiter=delimiter)
    columns = [str(c) for c in df.columns]
    for col, what in [(label, "--label"), *((s, "--sensitive") for s in sensitive)]:
        if col not in columns:
            raise ConfigError(f"{what} {col}: {path} has no such column. Columns: {', '.join(columns[:20])}.")
    file = Path(path).expanduser()
    header = header_line(file) if file.is_file() else ""
    sep = delimiter or (sniff_delimiter(header) if header else ",")
    duplicates: dict[str, tuple[str, int, list[int]]] = {}
    for name, positions in (duplicate_headers(header, sep) if header else {}).items():
        for nth in range(1, len(positions)):
            duplicates[f"{name}.{nth}"] = (name, nth + 1, positions)
    y = _label_classes(df, label, na_values)
    found = [_column(df, col, na_values, y, label, duplicates) for col in columns if col != label and col not in sensitive]
    features = [c for c in found if c.type != "drop"]
    private = values == "private"

    def level_line(col: str, lv: Sequence[str]) -> str:
        data_form = f"{{values: {_list(lv)}, source: data}}"
        return f"    {_flow(col)}: private   # in the file: {data_form}" if private else f"    {_flow(col)}: {data_form}"

    lines = [
        f"# dataset=table config for {path}, written by `raco data describe` (docs/your-own-data.md).",
        "# Keep it as <dir>/dataset/<name>.yaml and train with",
        "#   raco train --config-dir <dir> dataset=<name> constraint=dp eps=1" + ("" if private else " privacy.scope=paper"),
        "#",
    ]
    if private:
        lines += [
            "# Privacy: every column type, level list and the missing-value indicators are `private`: each run decides a",
            "# column's type (numeric, categorical, binary or drop) with its bounds or levels from noisy counts of its training",
            "# split, inside its eps (one accounted release, docs/privacy.md). The comments show what the file holds; those",
            "# values are NOT private. Where you know a public value (a type, a legal range, a code book), write it instead, e.g.",
            "# `age: numeric` under types and `age: [0, 120]` under bounds; a value copied from a comment keeps `source: data`,",
            "# which privacy.scope=model refuses until you change it to `source: public` (only for values known without the data).",
        ]
    else:
        lines += [
            "# Privacy: the bounds, level lists and missing-value indicators below were read from the file (source: data); they",
            "# are NOT private. privacy.scope=model refuses them: train with privacy.scope=paper, or replace each by a public",
            "# value (source: public, or a plain [lo, hi] / list) or by `private` (estimated inside eps).",
        ]
    lines += ["defaults:", "  - table", "  - _self_", "", "options:",
              f"  name: {_flow(file.name.removesuffix('.gz').rsplit('.', 1)[0] or 'table')}",
              f"  path: {_flow(str(file.resolve()))}", f"  label: {_flow(label)}"]
    if sep != ",":
        lines.append(f"  delimiter: {_flow(sep)}   # read from the header line")
    if y is None:
        lines.append(f"  threshold: null   # {label} has more than {MAX_LEVELS} values: class 1 when {label} > threshold (set it)")
    lines.append(f"  sensitive: {_flow(list(sensitive))}")
    lines.append("  types:")
    review: list[str] = []
    for c in found:
        file_form = f"{{type: {c.type}, source: data}}"
        if c.header_copy and (private or c.type == "drop"):  # the header's decision: public schema
            lines.append(f"    {_flow(c.name)}: drop   # a copy of a duplicated header name; in the file: {c.note}")
        elif private:
            extra = (f", range {_flow(list(c.bounds))}" if c.bounds is not None else
                     f", levels {_list(c.levels)}" if c.levels and len(c.levels) <= 12 else "")
            lines.append(f"    {_flow(c.name)}: private   # in the file: {file_form}: {c.note}{extra}")
        else:
            lines.append(f"    {_flow(c.name)}: {file_form}   # {c.note}")
        for item in c.review:
            lines.append(f"    #   REVIEW {c.name}: {item}")
            review.append(f"review {c.name}: {item}")
    lines.append("  levels:")
    for col in (label, *sensitive):
        lv = sorted_levels(tokens(df[col], na_values))
        if col == label and y is None:
            continue
        if col != label and len(lv) > MAX_LEVELS:
            review.append(f"review {col}: a sensitive column with {len(lv)} values: every group needs enough training rows")
        lines.append(level_line(col, lv))
    for c in features if not private else ():  # private: estimated with the column's type
        if c.type in ("binary", "categorical"):
            lines.append(level_line(c.name, c.levels))
    with_missing = [c.name for c in features if c.missing]
    indicators = f"{{columns: {_list(with_missing)}, source: data}}"
    lines.append(f"  missing_indicator: private   # in the file: {indicators}" if private else f"  missing_indicator: {indicators}")
    if na_values:
        lines.append(f"  na_values: {_list(list(na_values))}")
    numeric = [c for c in features if c.type == "numeric" and c.bounds is not None] if not private else []
    lines.append("bounds:" if numeric else "bounds: {}")
    for c in numeric:
        assert c.bounds is not None
        data_form = f"{{range: {_flow(list(c.bounds))}, source: data}}"
        lines.append(f"  {_flow(c.name)}: private   # in the file: {data_form}" if private else f"  {_flow(c.name)}: {data_form}")
    return "\n".join(lines) + "\n", review
