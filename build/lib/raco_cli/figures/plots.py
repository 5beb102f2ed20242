"""Paper-style figures from run records (matplotlib, Agg backend; PNG + PDF).

* trade-off (Figs. 2, 4-7, 8b, 9): y (test accuracy or error) vs the test constraint value,
  one curve per method and eps; mean over seeds with a 95 % CI band (and x error bars) along
  the curve, drawn from 3 seeds on; the Pareto front of each curve drawn solid with filled
  markers, dominated configurations hollow;
  published baseline points overlaid; optional dashed lines at the gamma targets.
* satisfaction (Fig. 3): achieved hard constraint vs accuracy per run, one colour per gamma,
  the gamma targets as dashed lines of the same colour.
* clipping (Fig. 8a): hard train constraint vs clipping norm, target as a dashed line.
* timing (Table 2): a CSV + Markdown table and a bar chart of time per step.
* group_table, mspe_vs_rho (regression, the DPSE paper): :mod:`raco_cli.figures.group_mspe`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raco_cli.figures import dro, group_mspe
from raco_cli.figures.aggregate import aggregate, as_number, curves, front_of, run_points
from raco_cli.figures.canvas import pyplot, save
from raco_cli.figures.pareto import mean_ci
from raco_cli.figures.published import PublishedPoint
from raco_cli.figures.specs import METHOD_LABEL, X_LABEL, FigureSpec

MARKERS = {"raco_dp": "o", "dp_fermi": "s", "sgda": "D", "sgd": "v", "dp_sgd": "^", "dpse": "P"}
MIN_SEEDS_FOR_BAND = 3  # CI bands and bars need this many seeds per configuration
PUBLISHED_MARKERS = {"DP-FERMI": "x", "Tran et al. 2021a": "+", "Tran et al. 2021b": "*", "Jagielski et al. 2019": "1"}


def _eps_colors(values: Sequence[Any]) -> dict[Any, Any]:
    import matplotlib

    finite = sorted({v for v in values if isinstance(v, (int, float))})
    cmap = matplotlib.colormaps["viridis"]
    out: dict[Any, Any] = {None: "black"}
    for i, v in enumerate(finite):
        out[v] = cmap(0.1 + 0.75 * i / max(len(finite) - 1, 1))
    return out


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _series_label(method: str, series: tuple[Any, ...], names: Sequence[str]) -> str:
    label = METHOD_LABEL.get(method, method)
    parts = []
    for name, value in zip(names, series):
        if value is None:
            continue
        parts.append(f"ε={_fmt(value)}" if name == "eps" else f"{name.split('.')[-1]}={_fmt(value)}")
    return f"{label} {' '.join(parts)}".strip()


def shrink_png(path: Path, *, colors: int = 128) -> Path:
    """Rewrite a PNG with a ``colors``-colour palette (3-4x smaller; how the figures under
    docs/figures are committed: ``raco figures --small``)."""
    from PIL import Image

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=colors)
    small.save(path, optimize=True)
    return path


def tradeoff(
    records: Sequence[Mapping[str, Any]],
    spec: FigureSpec,
    out_dir: Path,
    *,
    published: Sequence[PublishedPoint] = (),
) -> list[Path]:
    """The trade-off figure of ``spec`` (see the module docstring)."""
    plt = pyplot()
    pts = run_points(records, x_metric=spec.x_metric, y=spec.y, series=spec.series, where=spec.where)
    agg = aggregate(pts)
    by_curve = curves(agg)
    eps_index = spec.series.index("eps") if "eps" in spec.series else None
    eps_values = [k[1][eps_index] for k in by_curve] if eps_index is not None else []
    eps_values += [p.epsilon for p in published]
    colors = _eps_colors(eps_values)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    maximize = spec.y == "accuracy"
    for n_curve, ((method, series), cpts) in enumerate(by_curve.items()):
        eps = series[eps_index] if eps_index is not None else None
        color = colors.get(eps, "black") if method != "sgda" else "black"
        if len(spec.series) > 1 and eps_index is not None:  # a second split (e.g. dual): vary the line style
            style = ["-", "--", ":", "-."][n_curve % 4]
        else:
            style = "-" if method != "sgda" else ":"
        marker = MARKERS.get(method, "o")
        xs = [p.x.mean for p in cpts]
        ys = [p.y.mean for p in cpts]
        front = front_of(cpts, maximize_y=maximize)
        fx, fy = [xs[i] for i in front], [ys[i] for i in front]
        # the 95 % band (y) and bars (x) follow the drawn curve; with fewer than 3 seeds a t
        # interval is uninformative (t = 12.7 for 2) and would only hide the curves
        banded = [cpts[i] for i in front if cpts[i].n >= MIN_SEEDS_FOR_BAND]
        if banded:
            ax.fill_between([p.x.mean for p in banded], [max(p.y.mean - _finite(p.y.ci), 0.0) for p in banded],
                            [min(p.y.mean + _finite(p.y.ci), 1.0) for p in banded], color=color, alpha=0.15, linewidth=0)
            ax.errorbar([p.x.mean for p in banded], [p.y.mean for p in banded], xerr=[_finite(p.x.ci) for p in banded],
                        fmt="none", ecolor=color, alpha=0.4, linewidth=0.8)
        hollow = [i for i in range(len(cpts)) if i not in set(front)]
        hollow_dual = "method.dual" in spec.series and "soft" in series
        ax.plot(fx, fy, style, color=color, marker=marker, markersize=5,
                markerfacecolor="white" if hollow_dual else color,
                label=f"{_series_label(method, series, spec.series)} (n={max(p.n for p in cpts)})")
        ax.plot([xs[i] for i in hollow], [ys[i] for i in hollow], linestyle="none", marker=marker, markersize=5,
                markerfacecolor="white", color=color, alpha=0.7)
    for group in _published_groups(published):
        first = group[0]
        color = colors.get(first.epsilon, "grey")
        xs = [p.violation for p in group]
        ys = [p.test_accuracy if maximize else 1 - p.test_accuracy for p in group]
        ax.plot(xs, ys, ":", color=color, marker=PUBLISHED_MARKERS.get(first.method, "x"), markersize=6,
                label=f"{first.method} ε={_fmt(first.epsilon)} (published)")
    if spec.gamma_lines:
        gammas = sorted({p.knob_value for p in agg if p.knob == "constraint.gamma" and p.knob_value is not None})
        for g in gammas:
            ax.axvline(g, color="grey", linestyle="--", linewidth=0.8, alpha=0.6)
    # limits from the means (bands of few seeds can be very wide; rates live in [0, 1])
    all_x = [p.x.mean for c in by_curve.values() for p in c] + [p.violation for p in published]
    all_y = [p.y.mean for c in by_curve.values() for p in c]
    all_y += [(p.test_accuracy if maximize else 1 - p.test_accuracy) for p in published]
    _fit_limits(ax, all_x, all_y)
    ax.set_xlabel(X_LABEL.get(spec.x_metric, spec.x_metric))
    ax.set_ylabel("test accuracy" if maximize else "test error")
    ax.set_title(spec.title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if len(by_curve) + len(published) < 16 else 2,
              framealpha=0.8, borderaxespad=0.0)
    return save(fig, out_dir, spec.name)


def _finite(v: float) -> float:
    return v if math.isfinite(v) else 0.0


def _fit_limits(ax: Any, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Axis limits around the plotted means, with a margin, clipped to the rate range [0, 1]."""
    for values, setter in ((xs, ax.set_xlim), (ys, ax.set_ylim)):
        vals = [v for v in values if v is not None and math.isfinite(v)]
        if not vals:
            continue
        lo, hi = min(vals), max(vals)
        pad = max(0.1 * (hi - lo), 0.005)
        setter(max(lo - pad, -0.005 if lo >= 0 else lo - pad), min(hi + pad, 1.005))


def _published_groups(points: Sequence[PublishedPoint]) -> list[list[PublishedPoint]]:
    groups: dict[tuple[str, float], list[PublishedPoint]] = {}
    for p in points:
        groups.setdefault((p.method, p.epsilon), []).append(p)
    return [sorted(g, key=lambda p: p.point) for g in groups.values()]


def satisfaction(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path) -> list[Path]:
    """Fig. 3: achieved hard test constraint vs test accuracy per run; dashed line per gamma."""
    import matplotlib

    plt = pyplot()
    pts = run_points(records, x_metric="constraint_max_hard", series=("eps",), where=spec.where)
    gammas = sorted({p.knob_value for p in pts if p.knob_value is not None})
    cmap = matplotlib.colormaps["plasma"]
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0), sharey=True)
    for ax, split in zip(axes, ("train", "test")):
        for i, g in enumerate(gammas):
            color = cmap(0.05 + 0.8 * i / max(len(gammas) - 1, 1))
            sel = [p for p in pts if p.knob_value == g]
            achieved = [p.metrics.get(f"final/{split}/constraint_max_hard", math.nan) for p in sel]
            acc = [p.metrics.get(f"final/{split}/accuracy", math.nan) for p in sel]
            ok = [a <= g + 1e-12 for a in achieved if math.isfinite(a)]
            rate = sum(ok) / len(ok) if ok else math.nan
            ax.scatter(acc, achieved, color=color, s=14, alpha=0.8, label=f"γ={g:g}: {rate:.0%} satisfied")
            ax.axhline(g, color=color, linestyle="--", linewidth=1)
        ax.set_xlabel(f"{split} accuracy")
        ax.set_title(f"{split} split", fontsize=9)
        ax.legend(loc="best")
    axes[0].set_ylabel("achieved constraint value (hard rates)")
    fig.suptitle(spec.title, fontsize=10)
    return save(fig, out_dir, spec.name)


def clipping(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path) -> list[Path]:
    """Fig. 8a: hard train constraint value vs clipping norm (mean ± CI over seeds)."""
    plt = pyplot()
    by_clip: dict[float, list[float]] = {}
    gammas = set()
    for rec in records:
        if rec.get("status") != "FINISHED":
            continue
        c = as_number(rec["params"].get("method.clip_norm"))
        v = rec["metrics"].get(f"final/train/{spec.x_metric}")
        if c is None or v is None:
            continue
        by_clip.setdefault(c, []).append(v)
        g = as_number(rec["params"].get("constraint.gamma"))
        if g is not None:
            gammas.add(g)
    clips = sorted(by_clip)
    stats = [mean_ci(by_clip[c]) for c in clips]
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    ax.plot(clips, [s.mean for s in stats], "-o", color="C0", label="RaCO-DP, no noise (train, hard)")
    ax.fill_between(clips, [s.mean - s.ci for s in stats], [s.mean + s.ci for s in stats], color="C0", alpha=0.2)
    for g in sorted(gammas):
        ax.axhline(g, color="red", linestyle="--", linewidth=1, label=f"target γ={g:g}")
    ax.set_xscale("log")
    ax.set_xlabel("clipping norm C")
    ax.set_ylabel(f"{spec.x_metric} (train)")
    ax.set_title(spec.title, fontsize=9)
    ax.legend(loc="best")
    return save(fig, out_dir, spec.name)


def timing(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path) -> list[Path]:
    """Table 2: time per step (ms) per dataset x method, mean ± std over runs; runs trained in
    a batched group (metric ``batched_runs`` = R, docs/batched.md) in a column of their own,
    ``<method> (batched, R=..)``, whose time is a run's share of the group's step."""
    plt = pyplot()
    cells: dict[tuple[str, str], list[float]] = {}
    for rec in records:
        if rec.get("status") != "FINISHED":
            continue
        t = rec["metrics"].get("time_per_step_ms")
        if t is None:
            continue
        method = rec["tags"].get("method", "?")
        runs = rec["metrics"].get("batched_runs")
        if runs:
            method = f"{method} (batched, R={int(runs)})"
        key = (rec["tags"].get("dataset", "?"), method)
        cells.setdefault(key, []).append(float(t))
    datasets = sorted({d for d, _ in cells})
    order = ["sgd", "dp_sgd", "raco_dp", "dp_fermi"]
    known = {m for _, m in cells}
    methods = [c for m in order for c in [m, *sorted(k for k in known if k.startswith(m + " (batched"))] if c in known]
    methods += sorted(known - set(methods))

    def cell(d: str, m: str) -> str:
        v = cells.get((d, m))
        if not v:
            return "-"
        mean = sum(v) / len(v)
        std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
        return f"{mean:.3g} ± {std:.2g} ms"

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = ["dataset", *[_label(m) for m in methods]]
    rows = [[d, *[cell(d, m) for m in methods]] for d in datasets]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    (out_dir / f"{spec.name}.md").write_text("\n".join(md) + "\n")
    (out_dir / f"{spec.name}.csv").write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n")
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    width = 0.8 / max(len(methods), 1)
    for j, m in enumerate(methods):
        means = [sum(cells.get((d, m), [math.nan])) / len(cells.get((d, m), [1])) for d in datasets]
        ax.bar([i + j * width for i in range(len(datasets))], means, width, label=_label(m))
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(datasets))], datasets)
    ax.set_yscale("log")
    ax.set_ylabel("time per step (ms)")
    ax.set_title(spec.title, fontsize=9)
    ax.legend(loc="best")
    return [*save(fig, out_dir, spec.name), out_dir / f"{spec.name}.md", out_dir / f"{spec.name}.csv"]


def _label(column: str) -> str:
    """``raco_dp (batched, R=20)`` -> ``RaCO-DP (batched, R=20)``."""
    method, _, rest = column.partition(" ")
    return f"{METHOD_LABEL.get(method, method)} {rest}".strip()


def draw(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path, *, published: Sequence[PublishedPoint] = ()) -> list[Path]:
    """Draw ``spec`` from ``records``; returns the written files."""
    if spec.kind == "tradeoff":
        return tradeoff(records, spec, out_dir, published=published)
    if spec.kind == "satisfaction":
        return satisfaction(records, spec, out_dir)
    if spec.kind == "clipping":
        return clipping(records, spec, out_dir)
    if spec.kind == "timing":
        return timing(records, spec, out_dir)
    if spec.kind in ("dro_table", "dro_noise", "dro_mia", "dro_gradnorm"):
        draw_dro = {"dro_table": dro.accuracy_table, "dro_noise": dro.noise_table, "dro_mia": dro.mia_table,
                    "dro_gradnorm": dro.gradnorm_curves}[spec.kind]
        return draw_dro(records, spec, out_dir)
    if spec.kind in ("group_table", "mspe_vs_rho"):  # regression (the DPSE paper)
        return (group_mspe.group_table if spec.kind == "group_table" else group_mspe.mspe_vs_rho)(records, spec, out_dir)
    raise ValueError(f"unknown figure kind {spec.kind!r}")
