"""The text report of an experiment: Pareto table and hard-constraint satisfaction (pure)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from raco_cli.figures.aggregate import aggregate, curves, front_of, run_points
from raco_cli.figures.specs import X_METRIC


def x_metric_for(records: Sequence[Mapping[str, Any]]) -> str:
    """The constraint value to report: from the runs' constraint (dp -> dp_gap, ...)."""
    names = Counter(r.get("tags", {}).get("constraint") for r in records)
    for name, _ in names.most_common():
        if name in X_METRIC:
            return X_METRIC[name]
    return "constraint_max_hard"


def _pct(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{100 * v:.0f}%"


def report(
    records: Sequence[Mapping[str, Any]], *, experiment: str, uri: str, x_metric: str | None = None, all_points: bool = False
) -> str:
    """Pareto table per method/eps (non-dominated configurations, mean ± 95 % CI over seeds)
    and the satisfaction rate of the hard constraints at the selected checkpoints."""
    x_metric = x_metric or x_metric_for(records)
    status = Counter(r.get("status") for r in records)
    lines = [
        f"experiment {experiment} ({uri}): {len(records)} runs ("
        + ", ".join(f"{n} {str(s).lower()}" for s, n in sorted(status.items(), key=lambda kv: str(kv[0])))
        + ")",
    ]
    pts = run_points(records, x_metric=x_metric, series=("eps",))
    agg = aggregate(pts)
    lines.append(
        f"Pareto table: test accuracy vs test {x_metric}, mean ± 95% CI over seeds; "
        + ("all configurations (* = non-dominated)" if all_points else "non-dominated configurations of each method/eps")
    )
    header = f"{'method':<10} {'eps':>6} {'knob':<22} {'n':>3}  {'accuracy':<17} {x_metric:<17} {'sat.train':>9} {'sat.test':>9}"
    lines += [header, "-" * len(header)]
    for (method, series), cpts in curves(agg).items():
        front = set(front_of(cpts))
        for i, p in enumerate(cpts):
            if not all_points and i not in front:
                continue
            eps = "-" if series[0] is None else f"{series[0]:g}"
            knob = "-" if p.knob is None else f"{p.knob.split('.')[-1]}={'-' if p.knob_value is None else f'{p.knob_value:g}'}"
            mark = "*" if (all_points and i in front) else ""
            lines.append(
                f"{method + mark:<10} {eps:>6} {knob:<22} {p.n:>3}  {str(p.y):<17} {str(p.x):<17} "
                f"{_pct(p.satisfied_train):>9} {_pct(p.satisfied_test):>9}"
            )
    lines.append("")
    lines.append("Hard-constraint satisfaction at the selected checkpoint (constrained runs):")
    constrained = [r for r in pts if r.knob == "constraint.gamma" and r.params.get("constraint.name") not in (None, "none")]
    by_method: dict[tuple[str, Any], list[Any]] = {}
    for r in constrained:
        by_method.setdefault((r.method, r.series[0]), []).append(r)
    for (method, eps), ps in by_method.items():
        tr = [p.satisfied_train for p in ps if p.satisfied_train is not None]
        te = [p.satisfied_test for p in ps if p.satisfied_test is not None]
        eps_s = "-" if eps is None else f"{eps:g}"
        lines.append(
            f"  {method:<10} eps={eps_s:<6} train {sum(tr)}/{len(tr)} ({_pct(sum(tr) / len(tr) if tr else math.nan)})"
            f"   test {sum(te)}/{len(te)} ({_pct(sum(te) / len(te) if te else math.nan)})"
        )
    if not by_method:
        lines.append("  (none)")
    lines += _search_lines(records)
    failed = [r for r in records if r.get("status") == "FAILED"]
    if failed:
        lines.append("")
        lines.append(f"Failed runs ({len(failed)}):")
        for rec in failed[:10]:
            lines.append(f"  {rec['run_id'][:8]} {rec.get('tags', {}).get('raco.error', '(no error recorded)')[:160]}")
    return "\n".join(lines)


def _search_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The price of tuning inside eps, one line per private search's released run (``raco tune``
    under privacy.scope=model, tags ``raco.tune.*``): eps covers the search, so each trial
    trained at a fraction of it.

    >>> rec = {"tags": {"raco.tune.eps_covers": "the search", "method": "raco_dp", "raco.tune.eps_trial": "0.425",
    ...        "raco.tune.repetitions": "poisson: mean 10", "raco.tune.candidates": "8",
    ...        "raco.tune.eps_target": "1"}, "params": {"eps": "0.425"}, "metrics": {"privacy/eps_spent": 0.9998, "final/test/accuracy": 0.8235}}
    >>> print("\\n".join(_search_lines([rec])))
    <BLANKLINE>
    Private searches (raco tune, privacy.scope=model): eps covers the whole search, so each trial trained at less
      raco_dp    eps=1      search eps 0.9998; each trial at eps 0.425 (42% of it); poisson: mean 10 over 8 candidates; test accuracy 0.8235
    """
    searches = [r for r in records if r.get("tags", {}).get("raco.tune.eps_covers") == "the search"]
    if not searches:
        return []
    lines = ["", "Private searches (raco tune, privacy.scope=model): eps covers the whole search, so each trial trained at less"]
    for r in searches:
        tags, metrics = r.get("tags", {}), r.get("metrics", {})
        target = float(tags.get("raco.tune.eps_target", "nan"))
        trial = float(tags.get("raco.tune.eps_trial", "nan"))
        acc = metrics.get("final/test/accuracy")
        lines.append(
            f"  {tags.get('method') or r.get('params', {}).get('method.name', '?'):<10} eps={target:<6g} search eps {metrics.get('privacy/eps_spent', math.nan):.4g}; "
            f"each trial at eps {trial:.3g} ({_pct(trial / target)} of it); {tags.get('raco.tune.repetitions', '?')} over "
            f"{tags.get('raco.tune.candidates', '?')} candidates; test accuracy {'-' if acc is None else f'{acc:.4f}'}"
        )
    return lines
