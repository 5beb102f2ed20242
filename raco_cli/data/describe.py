"""``raco data describe FILE``: a starting ``dataset=table`` config read from the file itself.

The YAML it prints extends ``conf/dataset/table.yaml`` (``defaults: [table, _self_]``), so
it is kept as ``<dir>/dataset/<name>.yaml`` and used with ``raco train --config-dir <dir>
dataset=<name>``.  Every bound and level list in it is read from the data: they are *not*
private (:data:`WARNING`, printed on stderr and at the top of the YAML).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

from raco_cli.data.schema import numbers, tokens
from raco_cli.data.table import read_table, sorted_levels, storage_type
from raco_cli.errors import ConfigError

MAX_LEVELS = 50  # more distinct values than this: suggest `drop` (an identifier, free text)
WARNING = (
    "WARNING: the bounds and level lists below were read from the data itself; they are NOT private. "
    "Under privacy.scope=model (the default) replace them with public knowledge (domain ranges, code books, "
    "a published schema) before training, or accept them and train with privacy.scope=paper."
)


def _flow(value: object) -> str:
    """A YAML value on one line (``[a, b]``, quoted where YAML needs it)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).strip().removesuffix("...").strip()


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def describe(path: str, *, label: str, sensitive: Sequence[str], na_values: Sequence[str] = ()) -> str:
    """The YAML text of a starting config for the table at ``path`` (module docstring).

    Raises:
        ConfigError: the label or a sensitive column is not in the file.
        DataNotFoundError / DataIntegrityError: the file is missing or unreadable.
    """
    df = read_table(path, na_values=na_values, key="raco data describe FILE")
    columns = [str(c) for c in df.columns]
    for col, what in [(label, "--label"), *((s, "--sensitive") for s in sensitive)]:
        if col not in columns:
            raise ConfigError(f"{what} {col}: {path} has no such column. Columns: {', '.join(columns[:20])}.")
    n = len(df)
    types: list[str] = []
    levels: dict[str, list[str]] = {}
    bounds: list[str] = []
    indicators: list[str] = []
    for col in (label, *sensitive):
        lv = sorted_levels(tokens(df[col], na_values))
        if len(lv) > MAX_LEVELS and col == label:
            continue  # a numeric label: a threshold (below)
        levels[col] = list(lv)
    for col in columns:
        if col == label or col in sensitive:
            continue
        text = tokens(df[col], na_values)
        n_missing = int(sum(t is None for t in text))
        if n_missing:
            indicators.append(col)
        kind = storage_type(df[col], na_values)
        distinct = sorted_levels(text)
        note = f"{n_missing} missing of {n}"
        if kind == "numeric":
            values = numbers(df[col], column=col, where=path, na_values=na_values)
            present = values[~np.isnan(values)]
            if len(present):
                bounds.append(f"  {_flow(col)}: {_flow([_number(present.min()), _number(present.max())])}"
                              "   # data min/max: NOT private")
            types.append(f"    {_flow(col)}: numeric   # {note}")
        elif len(distinct) > MAX_LEVELS:
            types.append(f"    {_flow(col)}: drop   # {len(distinct)} distinct values in {n} rows (an identifier or free text?)")
        else:
            kind = "binary" if len(distinct) == 2 else "categorical"
            levels[col] = list(distinct)
            types.append(f"    {_flow(col)}: {kind}   # {len(distinct)} levels, {note}")
    lines = [
        f"# dataset=table config for {path}, written by `raco data describe` (docs/your-own-data.md).",
        "# Keep it as <dir>/dataset/<name>.yaml and train with",
        "#   raco train --config-dir <dir> dataset=<name> constraint=dp eps=1",
        "#",
        *("# " + line for line in _wrap(WARNING)),
        "defaults:",
        "  - table",
        "  - _self_",
        "",
        "options:",
        f"  path: {_flow(str(Path(path).expanduser().resolve()))}",
        f"  label: {_flow(label)}",
    ]
    if label not in levels:
        lines.append(f"  threshold: null   # {label} has more than {MAX_LEVELS} values: class 1 when {label} > threshold (set it)")
    lines.append(f"  sensitive: {_flow(list(sensitive))}")
    lines += ["  types:", *types]
    lines.append("  levels:" if levels else "  levels: {}")
    lines += [f"    {_flow(col)}: {_flow(lv)}" for col, lv in levels.items()]
    lines.append(f"  missing_indicator: {_flow(indicators)}   # columns with missing values in the file")
    if na_values:
        lines.append(f"  na_values: {_flow(list(na_values))}")
    lines.append("bounds:" if bounds else "bounds: {}")
    lines += bounds
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int = 92) -> list[str]:
    out, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return out + ([line] if line else [])
