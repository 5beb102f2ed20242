"""DP-DRO tables and figures from run records: the DP-DRO paper's Table 3 (test accuracy over
eps), Table 2 (membership-inference AUC over eps) and Figure 1 (gradient norm over training).

Records come from :func:`raco_cli.tracking.mlflow_store.run_records` (``final/<split>/<metric>``
metrics, flattened params); Figure 1 also needs each run's metric history, attached by
``raco figures`` as ``record["history"]``.  Seeds of one (dataset, method, eps) are aggregated
as mean ± sample standard deviation (the paper's Table 2 format).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raco_cli.figures.aggregate import as_number
from raco_cli.figures.canvas import pyplot, save
from raco_cli.figures.pareto import mean_ci
from raco_cli.figures.specs import METHOD_LABEL, FigureSpec

ORDER = ("dp_sgda", "dp_private_diff", "dp_double_spider", "dp_recursive_spider", "sgda", "spider")


def dataset_label(params: Mapping[str, str]) -> str:
    """``digits-ST``, ``adult``, ``adult[label 0.1]`` ... from a run's params."""
    name = params.get("dataset.name", "?")
    if str(params.get("dataset.options.st", "")).lower() == "true":
        name += "-ST"
    for key, short in (("dataset.imbalance.label_ratio", "label"), ("dataset.imbalance.group_ratio", "group")):
        if as_number(params.get(key)) is not None:
            name += f"[{short} {params[key]}]"
    return name


def _finished(records: Sequence[Mapping[str, Any]], where: Mapping[str, Sequence[Any]]) -> list[Mapping[str, Any]]:
    out = []
    for rec in records:
        if rec.get("status") != "FINISHED":
            continue
        params = rec.get("params", {})
        if all(any(as_number(params.get(k)) == as_number(v) or str(params.get(k)) == str(v) for v in vals) for k, vals in where.items()):
            out.append(rec)
    return out


def _stat(values: Sequence[float]) -> tuple[float, float, int]:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return math.nan, math.nan, 0
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return mean, std, len(v)


def _fmt(stat: tuple[float, float, int], digits: int = 4) -> str:
    mean, std, n = stat
    return "-" if n == 0 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _methods(keys: Sequence[str]) -> list[str]:
    return [m for m in ORDER if m in keys] + sorted(set(keys) - set(ORDER))


def grouped(records: Sequence[Mapping[str, Any]], metric: str) -> dict[tuple[str, str, float | None], list[float]]:
    """``(dataset, method, eps) -> [metric of each seed]`` (eps None for non-private methods)."""
    out: dict[tuple[str, str, float | None], list[float]] = {}
    for rec in records:
        value = rec.get("metrics", {}).get(metric)
        if value is None:
            continue
        params, tags = rec.get("params", {}), rec.get("tags", {})
        private = str(tags.get("private", "true")).lower() == "true"
        key = (dataset_label(params), tags.get("method") or params.get("method.name", "?"), as_number(params.get("eps")) if private else None)
        out.setdefault(key, []).append(float(value))
    return out


def _write_table(out_dir: Path, name: str, header: list[str], rows: list[list[str]]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    (out_dir / f"{name}.md").write_text("\n".join(md) + "\n")
    (out_dir / f"{name}.csv").write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [header, *rows]) + "\n")
    return [out_dir / f"{name}.md", out_dir / f"{name}.csv"]


def accuracy_table(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path) -> list[Path]:
    """Table 3: per dataset and eps, each method's test accuracy, worst-group accuracy and final
    gradient norm of the robust objective (train split when recorded, else test), and a figure
    of test accuracy against eps."""
    recs = _finished(records, spec.where)
    acc, wga = grouped(recs, "final/test/accuracy"), grouped(recs, "final/test/worst_group_accuracy")
    gn = grouped(recs, "final/train/grad_norm") or grouped(recs, "final/test/grad_norm")
    datasets = sorted({k[0] for k in acc})
    methods = _methods(sorted({k[1] for k in acc}))
    header = ["dataset", "eps", *[f"{METHOD_LABEL.get(m, m)}: acc / worst-group / |grad F|" for m in methods]]
    rows = []
    for d in datasets:
        for e in sorted({k[2] for k in acc if k[0] == d}, key=lambda v: math.inf if v is None else v):
            cells = []
            for m in methods:
                k = (d, m, e)
                cells.append("-" if k not in acc else f"{_fmt(_stat(acc[k]))} / {_fmt(_stat(wga.get(k, [])))} / {_fmt(_stat(gn.get(k, [])), 3)}")
            rows.append([d, "non-private" if e is None else f"{e:g}", *cells])
    files = _write_table(Path(out_dir), spec.name, header, rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, max(len(datasets), 1), figsize=(4.2 * max(len(datasets), 1), 3.2), squeeze=False,
                             layout="constrained")  # constrained: y labels clear the next panel
    for ax, d in zip(axes[0], datasets):
        for m in methods:
            pts = sorted((k[2], _stat(v)) for k, v in acc.items() if k[0] == d and k[1] == m and k[2] is not None)
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1][0] for p in pts], yerr=[p[1][1] for p in pts], marker="o", ms=3, capsize=2,
                            label=METHOD_LABEL.get(m, m))
        ax.set_xscale("log")
        ax.set_xlabel("ε")
        ax.set_ylabel("test accuracy")
        ax.set_title(d, fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(spec.title, fontsize=10)
    return [*save(fig, Path(out_dir), spec.name), *files]


def noise_table(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path) -> list[Path]:
    """The noise-dominated benchmark (docs/dro.md): per dataset, eps and method, the training DRO
    objective F (paper eq. 2, exact worst case), its gradient norm |grad F| (the paper's
    stationarity measure), test accuracy and worst-group test accuracy, each as mean ± 95 % CI
    (Student t) over seeds, and a figure of F and worst-group accuracy against eps."""
    recs = _finished(records, spec.where)
    columns = (("train F", "final/train/dro_objective", 3), ("train ‖∇F‖", "final/train/grad_norm", 3),
               ("test accuracy", "final/test/accuracy", 4), ("worst-group accuracy", "final/test/worst_group_accuracy", 4))
    values = {metric: grouped(recs, metric) for _, metric, _ in columns}
    keys = values["final/test/accuracy"]

    def cell(metric: str, key: tuple[str, str, float | None], digits: int) -> str:
        m = mean_ci(values[metric].get(key, []))
        form = ".2e" if abs(m.mean) >= 1e4 else f".{digits}f"  # a diverged F reads 2.43e+10, not 11 digits
        if m.n < 2:  # one seed has no interval (not ± 0)
            return "-" if m.n == 0 else format(m.mean, form)
        return f"{format(m.mean, form)} ± {format(m.ci, form)}"

    header = ["dataset", "eps", "method", "seeds", *[c[0] for c in columns]]
    rows = []
    datasets = sorted({k[0] for k in keys})
    for d in datasets:
        for e in sorted({k[2] for k in keys if k[0] == d}, key=lambda v: math.inf if v is None else v):
            for m in _methods(sorted({k[1] for k in keys if k[0] == d and k[2] == e})):
                k = (d, m, e)
                rows.append([d, "non-private" if e is None else f"{e:g}", METHOD_LABEL.get(m, m), str(len(keys[k])),
                             *[cell(metric, k, digits) for _, metric, digits in columns]])
    files = _write_table(Path(out_dir), spec.name, header, rows)
    plt = pyplot()
    shown = (("final/train/dro_objective", "training F (log)"), ("final/test/worst_group_accuracy", "worst-group test accuracy"))
    fig, axes = plt.subplots(max(len(datasets), 1), 2, figsize=(8.4, 3.2 * max(len(datasets), 1)), squeeze=False, layout="constrained")
    for row, d in zip(axes, datasets):
        for ax, (metric, label) in zip(row, shown):
            for m in _methods(sorted({k[1] for k in keys if k[0] == d})):
                pts = sorted((k[2], mean_ci(v)) for k, v in values[metric].items() if k[0] == d and k[1] == m and k[2] is not None)
                if pts:
                    ax.errorbar([p[0] for p in pts], [p[1].mean for p in pts], yerr=[p[1].ci for p in pts], marker="o", ms=3,
                                capsize=2, label=METHOD_LABEL.get(m, m))
            ax.set_xscale("log")
            if metric.endswith("dro_objective"):
                ax.set_yscale("log")
            ax.set_xlabel("ε")
            ax.set_ylabel(label)
            ax.set_title(d, fontsize=9)
    if datasets:
        axes[0][0].legend(fontsize=7)
    fig.suptitle(spec.title, fontsize=10)
    return [*save(fig, Path(out_dir), spec.name), *files]


def mia_table(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path) -> list[Path]:
    """Table 2: membership-inference AUC (loss-threshold and confidence attacks) per method x eps."""
    recs = _finished(records, spec.where)
    loss, conf = grouped(recs, "final/mia/auc_loss"), grouped(recs, "final/mia/auc_confidence")
    eps: list[Any] = sorted({k[2] for k in loss if k[2] is not None})
    if any(k[2] is None for k in loss):  # the non-private references: one column of their own
        eps.append(None)
    header = ["dataset", "method", *[f"eps={e:g}" if e is not None else "non-private" for e in eps]]
    rows = []
    for d in sorted({k[0] for k in loss}):
        for m in _methods(sorted({k[1] for k in loss if k[0] == d})):
            rows.append([d, METHOD_LABEL.get(m, m),
                         *[f"{_fmt(_stat(loss[(d, m, e)]))} (conf. {_fmt(_stat(conf.get((d, m, e), [])))})" if (d, m, e) in loss else "-"
                           for e in eps]])
    return _write_table(Path(out_dir), spec.name, header, rows)


def gradnorm_curves(records: Sequence[Mapping[str, Any]], spec: FigureSpec, out_dir: Path) -> list[Path]:
    """Figure 1: mean over seeds of |grad F(x_t)| against the step, one panel per dataset."""
    recs = _finished(records, spec.where)
    curves: dict[tuple[str, str], dict[int, list[float]]] = {}
    for rec in recs:
        hist = rec.get("history", {})
        series = hist.get("train/grad_norm") or hist.get("test/grad_norm") or []
        key = (dataset_label(rec.get("params", {})), rec.get("tags", {}).get("method", "?"))
        for step, value in series:
            curves.setdefault(key, {}).setdefault(int(step), []).append(float(value))
    datasets = sorted({k[0] for k in curves})
    plt = pyplot()
    fig, axes = plt.subplots(1, max(len(datasets), 1), figsize=(4.2 * max(len(datasets), 1), 3.2), squeeze=False,
                             layout="constrained")  # constrained: y labels clear the next panel
    for ax, d in zip(axes[0], datasets):
        for m in _methods(sorted({k[1] for k in curves if k[0] == d})):
            pts = sorted(curves[(d, m)].items())
            ax.plot([s for s, _ in pts], [sum(v) / len(v) for _, v in pts], label=METHOD_LABEL.get(m, m))
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("|∇F(x)|")
        ax.set_title(d, fontsize=9)
    if datasets:
        axes[0][0].legend(fontsize=7)
    fig.suptitle(spec.title, fontsize=10)
    return save(fig, Path(out_dir), spec.name)


HISTORY_KEYS = ("train/grad_norm", "test/grad_norm")
