"""Where a value of a dataset configuration comes from: public knowledge, the data, or a
private estimate (docs/your-own-data.md, docs/privacy.md "Values read from the data").

A bound or a level list read from the records themselves is not private (the largest income
of a table is one person's income), so every such value carries its provenance:

======================================  ====================================================
form                                    meaning
======================================  ====================================================
``dataset.bounds.<col>``:
``[lo, hi]``, ``[lo, hi, transform]``   public (hand-written: conf/dataset/*.yaml, your files)
``{range: [lo, hi], source: public}``   public, said explicitly (optional ``transform``)
``{range: [lo, hi], source: data}``     read from the data (``raco data describe --values data``)
``private``                             estimated privately inside the run's budget
``{source: private, transform: t}``     the same, through a public transform (log1p, ...)
``dataset.options.levels.<col>``:
``[a, b, ...]``                         public
``{values: [a, b], source: public}``    public, said explicitly
``{values: [a, b], source: data}``      read from the data
``private`` / ``{source: private}``     estimated privately (a DP-thresholded histogram)
``dataset.options.missing_indicator``:
``[col, ...]``                          public
``{columns: [...], source: public}``    public, said explicitly
``{columns: [...], source: data}``      read from the data
``private`` / ``{source: private}``     decided privately (a DP count of missing cells)
``dataset.options.types.<col>``:
``numeric`` / ``binary`` / ...          public (a declaration: taken as is)
``{type: t, source: public}``           public, said explicitly
``{type: t, source: data}``             read from the data (``raco data describe --values data``)
``private``                             decided privately from noisy counts of the training
                                        split, with the column's bounds or levels (one release)
======================================  ====================================================

``privacy.scope=model`` refuses a configuration holding a ``source: data`` value
(:func:`data_derived` names the keys); ``privacy.scope=paper`` accepts it (the paper's protocol).
``private`` values are estimated from the training split by :mod:`raco_cli.privacy.estimates`
(``dataset=table``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raco_cli.errors import ConfigError

PUBLIC, DATA, PRIVATE = "public", "data", "private"
SOURCES = (PUBLIC, DATA, PRIVATE)
_VALUE_KEY = {"bounds": "range", "levels": "values", "indicators": "columns"}
TYPE_NAMES = ("numeric", "categorical", "binary", "drop")


@dataclass(frozen=True)
class Entry:
    """One configured value and its provenance.

    Attributes:
        value: the plain value (``[lo, hi]`` or ``[lo, hi, transform]``, a level list, a list
            of columns); None when ``source`` is private.
        source: ``public``, ``data`` or ``private``.
        transform: (private bounds) the public transform the estimated bounds go through.
    """

    value: Any
    source: str
    transform: str = "none"

    @property
    def private(self) -> bool:
        return self.source == PRIVATE


def _entry(raw: object, key: str, kind: str) -> Entry:
    field = _VALUE_KEY[kind]
    example = {"bounds": "[lo, hi]", "levels": "['a', 'b']", "indicators": "[col]"}[kind]
    if raw == PRIVATE:
        return Entry(None, PRIVATE)
    if isinstance(raw, (list, tuple)):
        return Entry(list(raw), PUBLIC)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key} must be {example}, {{{field}: {example}, source: public}} or private (got {key}={raw!r}); "
                          "docs/your-own-data.md, 'Where a value comes from'.")
    allowed = {field, "source"} | ({"transform"} if kind == "bounds" else set())
    unknown = sorted(set(map(str, raw)) - allowed)
    if unknown:
        raise ConfigError(f"Unknown key {key}.{unknown[0]}. Allowed: {', '.join(sorted(allowed))}.")
    source = raw.get("source")
    if source not in SOURCES:
        raise ConfigError(f"{key}.source must be one of {', '.join(SOURCES)} (got {key}.source={source!r}); public: known "
                          "without the data, data: read from it (privacy.scope=paper only), private: estimated inside eps.")
    transform = raw.get("transform", "none")
    if source == PRIVATE:
        if field in raw:
            raise ConfigError(f"{key} is private and also gives {field}; a private value is estimated by raco: remove {field}, "
                              f"or declare it public ({{{field}: ..., source: public}}).")
        return Entry(None, PRIVATE, str(transform))
    value = raw.get(field)
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}.{field} must be a list like {example} (got {key}.{field}={value!r}).")
    value = list(value)
    if kind == "bounds" and "transform" in raw:
        value = [*value[:2], transform]
    return Entry(value, str(source))


def bound(raw: object, key: str) -> Entry:
    """A ``dataset.bounds`` entry (module docstring)."""
    return _entry(raw, key, "bounds")


def levels(raw: object, key: str) -> Entry:
    """A ``dataset.options.levels`` entry (module docstring)."""
    return _entry(raw, key, "levels")


def indicators(raw: object, key: str = "dataset.options.missing_indicator") -> Entry:
    """``dataset.options.missing_indicator`` (module docstring); null is an empty public list."""
    return Entry([], PUBLIC) if raw is None else _entry(raw, key, "indicators")


def column_type(raw: object, key: str) -> Entry:
    """A ``dataset.options.types`` entry: a type name (public), ``private`` (decided inside
    eps, :mod:`raco_cli.privacy.estimates`) or ``{type: t, source: public|data}``.

    >>> column_type("binary", "k"), column_type("private", "k").private, column_type({"type": "drop", "source": "data"}, "k").source
    (Entry(value='binary', source='public', transform='none'), True, 'data')
    """
    allowed = f"one of {', '.join(TYPE_NAMES)}, private or {{type: <one of them>, source: public}}"
    if raw == PRIVATE or (isinstance(raw, Mapping) and raw.get("source") == PRIVATE and set(map(str, raw)) == {"source"}):
        return Entry(None, PRIVATE)
    if isinstance(raw, str) and raw in TYPE_NAMES:
        return Entry(raw, PUBLIC)
    if isinstance(raw, Mapping):
        unknown = sorted(set(map(str, raw)) - {"type", "source"})
        if unknown:
            raise ConfigError(f"Unknown key {key}.{unknown[0]}. Allowed: source, type.")
        source, value = raw.get("source"), raw.get("type")
        if source not in (PUBLIC, DATA):
            raise ConfigError(f"{key}.source must be public or data (got {key}.source={source!r}); a private type is written "
                              f"{key}=private.")
        if value not in TYPE_NAMES:
            raise ConfigError(f"{key}.type must be one of {', '.join(TYPE_NAMES)} (got {key}.type={value!r}).")
        return Entry(str(value), str(source))
    raise ConfigError(f"{key} must be {allowed} (got {raw!r}).")


def plain_bounds(raw: Mapping[str, object] | None, *, dataset: str) -> dict[str, object]:
    """``dataset.bounds`` with every public or data-derived entry as its plain list.

    Raises:
        ConfigError: a malformed entry, or ``private`` for a dataset that estimates nothing.
    """
    out: dict[str, object] = {}
    for col, value in (raw or {}).items():
        entry = bound(value, f"dataset.bounds.{col}")
        if entry.private:
            raise ConfigError(f"dataset.bounds.{col} is private, which dataset={dataset} does not estimate (only dataset=table "
                              f"does); give public bounds [lo, hi] in conf/dataset/{dataset}.yaml.")
        out[str(col)] = entry.value
    return out


def data_derived(dataset: Mapping[str, Any]) -> list[str]:
    """The keys of a composed ``dataset`` config that hold values read from the data
    (``source: data``), in config order.

    >>> data_derived({"bounds": {"age": [18, 90], "income": {"range": [0, 9], "source": "data"}},
    ...               "options": {"levels": {"city": {"values": ["a"], "source": "data"}, "sex": ["F", "M"]},
    ...                           "missing_indicator": "private", "types": {"flag": {"type": "binary", "source": "data"}}}})
    ['dataset.bounds.income', 'dataset.options.levels.city', 'dataset.options.types.flag']
    """
    keys: list[str] = []
    for col, raw in (dataset.get("bounds") or {}).items():
        if isinstance(raw, Mapping) and raw.get("source") == DATA:
            keys.append(f"dataset.bounds.{col}")
    options = dataset.get("options") or {}
    levels_cfg = options.get("levels") if isinstance(options, Mapping) else None
    for col, raw in (levels_cfg or {}).items() if isinstance(levels_cfg, Mapping) else ():
        if isinstance(raw, Mapping) and raw.get("source") == DATA:
            keys.append(f"dataset.options.levels.{col}")
    ind = options.get("missing_indicator") if isinstance(options, Mapping) else None
    if isinstance(ind, Mapping) and ind.get("source") == DATA:
        keys.append("dataset.options.missing_indicator")
    types_cfg = options.get("types") if isinstance(options, Mapping) else None
    for col, raw in (types_cfg or {}).items() if isinstance(types_cfg, Mapping) else ():
        if isinstance(raw, Mapping) and raw.get("source") == DATA:
            keys.append(f"dataset.options.types.{col}")
    return keys


def refusal(keys: list[str]) -> str:
    """The one-line refusal of data-derived values under ``privacy.scope=model``."""
    shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
    return (f"{shown} {'holds a value' if len(keys) == 1 else 'hold values'} read from the data (source: data), which "
            "privacy.scope=model does not cover: declare them public (source: public, or write the known range / code book) "
            "or let raco estimate them privately inside eps (write private); or train with privacy.scope=paper.")


@dataclass(frozen=True)
class Estimates:
    """The ``private`` values of a table, estimated from its training split: one accounted
    release (:mod:`raco_cli.privacy.estimates`); everything here may be written.

    Attributes:
        bounds: numeric column -> (lo, hi).
        levels: column -> the released levels (sorted).
        indicators: the columns that get a ``<col>=missing`` feature (private ``missing_indicator``).
        types: column -> the type decided from the noisy counts (private ``types``): numeric,
            categorical, binary or drop.
        noise_multiplier: sigma of the Gaussian release (std / L2 sensitivity).
        columns: M, the columns the release touches (L2 sensitivity sqrt(M)).
        std: the noise std of every count, sigma sqrt(M).
        threshold: tau, the noisy count a level or bin needs to be released.
        reserved_delta: the delta the thresholding of data-dependent keys takes from the run's delta.
    """

    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    levels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    indicators: tuple[str, ...] = ()
    types: Mapping[str, str] = field(default_factory=dict)
    noise_multiplier: float = 0.0
    columns: int = 0
    std: float = 0.0
    threshold: float = 0.0
    reserved_delta: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"bounds": {k: [float(lo), float(hi)] for k, (lo, hi) in self.bounds.items()},
                "levels": {k: list(v) for k, v in self.levels.items()}, "missing_indicator": list(self.indicators),
                **({"types": dict(self.types)} if self.types else {}),
                "noise_multiplier": self.noise_multiplier, "columns": self.columns, "std": self.std,
                "threshold": self.threshold, "reserved_delta": self.reserved_delta}
