"""Run records (from :func:`raco_cli.tracking.mlflow_store.run_records`) -> figure points.

One run is a :class:`RunPoint`; the seeds of one configuration (method, series values,
knob value) aggregate into an :class:`AggPoint` with mean ± 95 % CI; the Pareto front of a
curve is computed on the aggregated means (:mod:`raco_cli.figures.pareto`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raco_cli.figures.pareto import MeanCI, mean_ci, pareto_front
from raco_cli.figures.specs import DEFAULT_KNOB, KNOB


def as_number(text: Any) -> float | None:
    """An MLflow param (a string) as a float; None for null/None/non-numbers.

    >>> as_number("1"), as_number("0.05"), as_number("None")
    (1.0, 0.05, None)
    """
    if text is None:
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def matches(value: Any, allowed: Iterable[Any]) -> bool:
    """Whether an MLflow param equals one of ``allowed`` (numbers compared as floats, else as strings)."""
    num = as_number(value)
    for a in allowed:
        an = as_number(a)
        if (num is not None and an is not None and math.isclose(num, an)) or str(value) == str(a):
            return True
    return False


def knob_of(method: str) -> str | None:
    return KNOB.get(method, DEFAULT_KNOB)


@dataclass(frozen=True)
class RunPoint:
    """One finished run as a trade-off point."""

    method: str
    series: tuple[Any, ...]
    knob: str | None
    knob_value: float | None
    seed: int | None
    x: float
    y: float
    satisfied_train: bool | None
    satisfied_test: bool | None
    private: bool
    metrics: Mapping[str, float]
    params: Mapping[str, str]


@dataclass(frozen=True)
class AggPoint:
    """The seeds of one configuration: mean ± CI of x and y, satisfaction rates."""

    method: str
    series: tuple[Any, ...]
    knob: str | None
    knob_value: float | None
    x: MeanCI
    y: MeanCI
    n: int
    satisfied_train: float  # fraction of seeds whose selected checkpoint meets the train constraint
    satisfied_test: float


def run_points(
    records: Sequence[Mapping[str, Any]],
    *,
    x_metric: str,
    y: str = "accuracy",
    split: str = "test",
    series: Sequence[str] = ("eps",),
    where: Mapping[str, Sequence[Any]] | None = None,
) -> list[RunPoint]:
    """FINISHED runs -> points.  Non-private methods have no eps (their series value is None).

    ``y`` is ``accuracy`` or ``error`` (1 - accuracy) of ``split``; x is ``final/<split>/<x_metric>``.
    Runs missing either value are left out.  The points come in one order (:func:`point_order`),
    whatever order the store lists the runs in: the means summed from them, and a scatter's
    overlapping markers, are then the same bits from one run of a sweep to the next.
    """
    out = []
    for rec in records:
        if rec.get("status") != "FINISHED":
            continue
        params, metrics, tags = rec.get("params", {}), rec.get("metrics", {}), rec.get("tags", {})
        if where and not all(matches(params.get(k), v) for k, v in where.items()):
            continue
        method = tags.get("method") or params.get("method.name", "?")
        private = str(tags.get("private", "true")).lower() == "true"
        acc = metrics.get(f"final/{split}/accuracy")
        x = metrics.get(f"final/{split}/{x_metric}")
        if acc is None or x is None or not (math.isfinite(acc) and math.isfinite(x)):
            continue
        yv = acc if y == "accuracy" else 1.0 - acc
        # a private search's released run trained at a per-trial eps; the eps it is reported at is
        # the search's, which covers the whole search (tag written by run/private_search.py)
        values = {**params, "eps": tags["raco.tune.eps_target"]} if "raco.tune.eps_target" in tags else params
        key = tuple(
            (None if (s == "eps" and not private) else (as_number(values.get(s)) if as_number(values.get(s)) is not None else values.get(s)))
            for s in series
        )
        knob = knob_of(method)
        st, ste = metrics.get("final/train/satisfied"), metrics.get(f"final/{split}/satisfied")
        seed = as_number(params.get("seed"))
        out.append(
            RunPoint(
                method=method, series=key, knob=knob, knob_value=as_number(params.get(knob)) if knob else None,
                seed=int(seed) if seed is not None else None, x=float(x), y=float(yv),
                satisfied_train=None if st is None else bool(st), satisfied_test=None if ste is None else bool(ste),
                private=private, metrics=metrics, params=params,
            )
        )
    return sorted(out, key=point_order)


def point_order(p: RunPoint) -> tuple[Any, ...]:
    """Points by curve (:func:`curve_order`), knob value, seed, then x and y."""
    unset = p.knob_value is None or p.knob_value != p.knob_value
    return (*curve_order(p.method, p.series), unset, 0.0 if unset else p.knob_value, -1 if p.seed is None else p.seed, p.x, p.y)


def aggregate(points: Sequence[RunPoint]) -> list[AggPoint]:
    """Group the seeds of each (method, series, knob value); groups in first-seen order."""
    groups: OrderedDict[tuple[Any, ...], list[RunPoint]] = OrderedDict()
    for p in points:
        groups.setdefault((p.method, p.series, p.knob, p.knob_value), []).append(p)
    out = []
    for (method, series, knob, value), pts in groups.items():
        st = [p.satisfied_train for p in pts if p.satisfied_train is not None]
        ste = [p.satisfied_test for p in pts if p.satisfied_test is not None]
        out.append(
            AggPoint(
                method=method, series=series, knob=knob, knob_value=value,
                x=mean_ci([p.x for p in pts]), y=mean_ci([p.y for p in pts]), n=len(pts),
                satisfied_train=sum(st) / len(st) if st else math.nan,
                satisfied_test=sum(ste) / len(ste) if ste else math.nan,
            )
        )
    return out


def curve_order(method: str, series: tuple[Any, ...]) -> tuple[Any, ...]:
    """Curves by method, then series values (numbers ascending, then text, then unset): the
    order in which the store lists its runs must not reorder a figure's curves, their line
    styles and legend, or a table's rows."""
    return (method, *((0, float(v), "") if isinstance(v, (int, float)) else (1 if v is not None else 2, 0.0, str(v)) for v in series))


def curves(agg: Sequence[AggPoint]) -> OrderedDict[tuple[str, tuple[Any, ...]], list[AggPoint]]:
    """Aggregated points per curve (method, series), curves in :func:`curve_order`, each
    curve's points sorted by x."""
    out: dict[tuple[str, tuple[Any, ...]], list[AggPoint]] = {}
    for a in agg:
        out.setdefault((a.method, a.series), []).append(a)
    for key in out:
        out[key].sort(key=lambda a: (a.x.mean, -a.y.mean))
    return OrderedDict(sorted(out.items(), key=lambda kv: curve_order(*kv[0])))


def front_of(points: Sequence[AggPoint], *, maximize_y: bool = True) -> list[int]:
    """Indices (into ``points``) of the non-dominated configurations of one curve."""
    return pareto_front([p.x.mean for p in points], [p.y.mean for p in points], maximize_y=maximize_y)
