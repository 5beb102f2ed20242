"""Per-group mean squared prediction error of regression runs: the DPSE paper's Tables 1-3 (a table per
rho: group x variant, mean ± 95 % CI over seeds, the paper's numbers beside ours) and Figure 2 (the
smallest group's MSPE against rho, one panel per slope pair).  Aggregation is pure; drawing uses the
helpers of :mod:`raco_cli.figures.canvas`.

A run's *variant* names what it computes: DPSE (tailored budgets), DPNoSE (``allocation=uniform``),
either with the bounded-group-loss penalty (``bgl_penalty > 0``: "+ BGL"), DP-SGD, SGD.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raco_cli.figures.aggregate import as_number, matches
from raco_cli.figures.canvas import pyplot, save
from raco_cli.figures.pareto import MeanCI, mean_ci

PUBLISHED_DPSE = Path(__file__).with_name("published_dpse.csv")
VARIANTS = ("DPNoSE", "DPSE", "DPNoSE + BGL", "DPSE + BGL", "DP-SGD", "SGD (non-private)")
PAPER_COLUMNS = {"DPNoSE": "dpnose", "DPSE": "dpse"}


def variant(method: str, params: Mapping[str, str]) -> str:
    """The variant label of a run from its method and MLflow params.

    >>> variant("dpse", {"method.options.allocation": "uniform", "method.options.bgl_penalty": "0.0"})
    'DPNoSE'
    >>> variant("dpse", {"method.options.allocation": "sum", "method.options.bgl_penalty": "1"})
    'DPSE + BGL'
    >>> variant("dpse", {"method.options.allocation": "sum", "method.options.bgl_penalty": "0.15"})
    'DPSE + BGL G=0.15'
    """
    if method == "dpse":
        base = "DPNoSE" if params.get("method.options.allocation") == "uniform" else "DPSE"
        penalty = as_number(params.get("method.options.bgl_penalty"))
        if not penalty:
            return base
        return f"{base} + BGL" if penalty == 1 else f"{base} + BGL G={penalty:g}"
    return {"dp_sgd": "DP-SGD", "sgd": "SGD (non-private)"}.get(method, method)


def variant_order(label: str) -> tuple[int, str, int]:
    """Sort key: the order of :data:`VARIANTS` by base label, then the penalty, DPNoSE first.

    >>> sorted(["DPSE + BGL G=0.2", "DPNoSE + BGL G=0.2", "DPSE", "DP-SGD"], key=variant_order)
    ['DPSE', 'DPNoSE + BGL G=0.2', 'DPSE + BGL G=0.2', 'DP-SGD']
    """
    base, _, g = label.partition(" G=")
    rank = VARIANTS.index(base) if base in VARIANTS else len(VARIANTS)
    bgl = base.endswith("+ BGL")
    return (rank if not bgl else VARIANTS.index("DPNoSE + BGL"), g, int(base.startswith("DPSE")) if bgl else 0)


def untailored(label: str) -> str | None:
    """The DPNoSE counterpart of a DPSE variant (same objective, uniform budgets), else None.

    >>> untailored("DPSE + BGL G=0.2"), untailored("DPNoSE")
    ('DPNoSE + BGL G=0.2', None)
    """
    return "DPNoSE" + label[len("DPSE"):] if label.startswith("DPSE") else None


def group_values(
    records: Sequence[Mapping[str, Any]], *, where: Mapping[str, Sequence[Any]] | None = None, split: str = "test"
) -> dict[tuple[str, str], list[float]]:
    """``(variant, group) -> [MSPE of each FINISHED run]``.  ``where`` filters private runs only
    (a non-private reference has no budget to match)."""
    return {k: list(v.values()) for k, v in group_values_by_seed(records, where=where, split=split).items()}


def group_values_by_seed(
    records: Sequence[Mapping[str, Any]], *, where: Mapping[str, Sequence[Any]] | None = None, split: str = "test"
) -> dict[tuple[str, str], dict[int, float]]:
    """``(variant, group) -> {seed: MSPE}`` (see :func:`group_values`; a seed draws the mixture, so
    the same seed is the same data under every variant: differences can be paired)."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    prefix = f"final/{split}/group_mspe/"
    for rec in records:
        if rec.get("status") != "FINISHED":
            continue
        params, tags = rec.get("params", {}), rec.get("tags", {})
        private = str(tags.get("private", "true")).lower() == "true"
        if private and where and not all(matches(params.get(k), v) for k, v in where.items()):
            continue
        label = variant(tags.get("method") or params.get("method.name", "?"), params)
        seed = int(as_number(params.get("seed")) or 0)
        for name, value in rec.get("metrics", {}).items():
            if name.startswith(prefix) and math.isfinite(value):
                out.setdefault((label, name[len(prefix):]), {})[seed] = float(value)
    return out


def paired_change(a: Mapping[int, float], b: Mapping[int, float]) -> MeanCI:
    """Mean ± 95 % CI over the seeds both have of the relative change ``100 (a_s / b_s - 1)`` (%).

    >>> str(paired_change({0: 9.0, 1: 18.0}, {0: 10.0, 1: 20.0, 2: 5.0}))
    '-10.0000 ± 0.0000'
    """
    return mean_ci([100.0 * (a[s] / b[s] - 1.0) for s in sorted(set(a) & set(b)) if b[s] > 0])


def load_paper_table(rho: float, path: Path = PUBLISHED_DPSE) -> dict[tuple[str, str], float]:
    """The paper's ``(variant, group) -> MSPE`` at ``rho`` (groups named group1..group5)."""
    rows = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    out = {}
    for row in csv.DictReader(rows):
        if math.isclose(float(row["rho"]), rho):
            for label, column in PAPER_COLUMNS.items():
                out[(label, f"group{row['group']}")] = float(row[column])
    return out


def table_rows(
    by_seed: Mapping[tuple[str, str], Mapping[int, float]], paper: Mapping[tuple[str, str], float]
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the group table: per group, the paper's value (where it has one) beside
    ours as mean ± 95 % CI (n seeds) for each variant present, then for each (tailored,
    untailored) pair the relative change, the paper's and ours paired by seed."""
    variants = sorted({k[0] for k in by_seed}, key=variant_order)
    groups = sorted({k[1] for k in by_seed} | {k[1] for k in paper}, key=_group_order)
    pairs = _pairs(variants)
    header = ["group"]
    for v in variants:
        if any(k[0] == v for k in paper):
            header.append(f"{v} (paper)")
        header.append(f"{v} (ours)")
    for a, b in pairs:
        if any(k[0] == a for k in paper):
            header.append(f"{a} vs {b}, % (paper)")
        header.append(f"{a} vs {b}, % (ours, paired)")
    rows = []
    for g in groups:
        row = [g]
        for v in variants:
            if any(k[0] == v for k in paper):
                row.append(f"{paper[(v, g)]:.2f}" if (v, g) in paper else "-")
            row.append(_fmt(mean_ci(list(by_seed.get((v, g), {}).values()))))
        for a, b in pairs:
            if any(k[0] == a for k in paper):
                row.append(f"{100 * (paper[(a, g)] / paper[(b, g)] - 1):+.1f}" if (a, g) in paper else "-")
            change = paired_change(by_seed.get((a, g), {}), by_seed.get((b, g), {}))
            row.append("-" if change.n == 0 else f"{change.mean:+.2f} ± {change.ci:.2f}")
        rows.append(row)
    return header, rows


def _pairs(variants: Sequence[str]) -> list[tuple[str, str]]:
    """(tailored, untailored) pairs present: the budget allocation is their only difference."""
    return [(a, b) for a in variants if (b := untailored(a)) is not None and b in variants]


def _group_order(name: str) -> tuple[int, str]:
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits) if digits else 0, name)


def _fmt(m: MeanCI) -> str:
    if m.n == 0:
        return "-"
    return f"{m.mean:.2f} ± {m.ci:.2f} (n={m.n})" if m.n > 1 else f"{m.mean:.2f} (n=1)"


def group_table(records: Sequence[Mapping[str, Any]], spec: Any, out_dir: Path) -> list[Path]:
    """Tables 1-3: a Markdown + CSV table and a bar chart (mean ± 95 % CI per group and variant,
    the paper's DPSE / DPNoSE values as markers)."""
    rho = float(spec.where["privacy.rho"][0])
    by_seed = group_values_by_seed(records, where=spec.where)
    values = {k: list(v.values()) for k, v in by_seed.items()}
    paper = load_paper_table(rho)
    header, rows = table_rows(by_seed, paper)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"{spec.title}: test MSPE per group, mean ± 95 % CI over seeds", "",
          "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    (out_dir / f"{spec.name}.md").write_text("\n".join(md) + "\n")
    with open(out_dir / f"{spec.name}.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["variant", "group", "mean", "ci95", "n", "paper"])
        for (v, g), vals in sorted(values.items(), key=lambda kv: (variant_order(kv[0][0]), _group_order(kv[0][1]))):
            m = mean_ci(vals)
            writer.writerow([v, g, f"{m.mean:.6g}", f"{m.ci:.6g}", m.n, paper.get((v, g), "")])
    plt = pyplot()
    variants = sorted({k[0] for k in values}, key=variant_order)
    groups = sorted({k[1] for k in values}, key=_group_order)
    fig, ax = plt.subplots(figsize=(8.4, 3.8))
    width = 0.8 / max(len(variants), 1)
    for j, v in enumerate(variants):
        stats = [mean_ci(values.get((v, g), [])) for g in groups]
        xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [s.mean for s in stats], width, yerr=[s.ci for s in stats], capsize=2, label=v, color=f"C{j % 10}")
        if v in PAPER_COLUMNS:
            ax.plot(xs, [paper.get((v, g), math.nan) for g in groups], linestyle="none", marker="_", markersize=14,
                    markeredgewidth=2, color="black")
    ax.plot([], [], linestyle="none", marker="_", markersize=14, markeredgewidth=2, color="black", label="paper (DPNoSE, DPSE)")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("test MSPE")
    ax.set_title(f"{spec.title} (bars: ours, 95 % CI)", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    return [*save(fig, out_dir, spec.name), out_dir / f"{spec.name}.md", out_dir / f"{spec.name}.csv"]


def smallest_group_points(records: Sequence[Mapping[str, Any]], *, split: str = "test") -> dict[tuple[str, str, float, str], dict[int, float]]:
    """Figure 2: ``(slopes, ratio, rho, variant) -> {seed: MSPE of the smallest group}`` (the last
    group: the mixture's sizes decrease)."""
    out: dict[tuple[str, str, float, str], dict[int, float]] = {}
    for rec in records:
        if rec.get("status") != "FINISHED":
            continue
        params, metrics = rec.get("params", {}), rec.get("metrics", {})
        groups = sorted((k for k in metrics if k.startswith(f"final/{split}/group_mspe/")), key=_group_order)
        rho = as_number(params.get("privacy.rho"))
        if not groups or rho is None:
            continue
        label = variant(rec.get("tags", {}).get("method") or params.get("method.name", "?"), params)
        key = (str(params.get("dataset.options.slopes")), str(params.get("dataset.options.ratio")), rho, label)
        out.setdefault(key, {})[int(as_number(params.get("seed")) or 0)] = float(metrics[groups[-1]])
    return out


PAPER_SLOPES = ("[-10, 10]", "[10, -10]", "[10, 1]", "[-10, -1]")  # Figure 2's order (as MLflow params)
PAPER_CLAIM = (-50.0, -10.0)  # "10 % to 50 % reduction in the MSPE" of the smallest group (abstract, Section 6)


def mspe_vs_rho(records: Sequence[Mapping[str, Any]], spec: Any, out_dir: Path) -> list[Path]:
    """Figure 2: per slope pair (columns), the smallest group's test MSPE against rho (log; top
    row, one line per variant and size ratio, mean ± 95 % CI) and the relative change of DPSE
    against DPNoSE paired by seed (bottom row, %, with the paper's claimed 10-50 % reduction
    shaded); a CSV of every point."""
    pts = smallest_group_points(records)
    slopes = sorted({k[0] for k in pts}, key=lambda sl: (PAPER_SLOPES.index(sl) if sl in PAPER_SLOPES else len(PAPER_SLOPES), sl))
    ratios = sorted({k[1] for k in pts}, key=lambda r: as_number(r) or 0)
    variants = sorted({k[3] for k in pts}, key=variant_order)
    pairs = _pairs(variants)
    plt = pyplot()
    fig, axes = plt.subplots(2, max(len(slopes), 1), figsize=(3.6 * max(len(slopes), 1), 6.4), squeeze=False, sharex=True)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = [["slopes", "ratio", "rho", "variant", "mean", "ci95", "n"]]
    for col, sl in enumerate(slopes):
        top, bottom = axes[0][col], axes[1][col]
        bottom.axhspan(*PAPER_CLAIM, color="grey", alpha=0.15, label="paper's claim")
        bottom.axhline(0.0, color="black", linewidth=0.8)
        for ci_, ratio in enumerate(ratios):
            for v in variants:
                rhos = sorted(k[2] for k in pts if k[0] == sl and k[1] == ratio and k[3] == v)
                stats = [mean_ci(list(pts[(sl, ratio, r, v)].values())) for r in rhos]
                table += [[sl, ratio, f"{r:g}", v, f"{s.mean:.6g}", f"{s.ci:.6g}", str(s.n)] for r, s in zip(rhos, stats)]
                tailored = v.startswith("DPSE")
                top.errorbar(rhos, [s.mean for s in stats], yerr=[s.ci for s in stats], color=f"C{ci_}", capsize=2,
                             linestyle="-" if tailored else "--", marker="o" if tailored else "s", markersize=3 if tailored else 5,
                             markerfacecolor=None if tailored else "none", label=f"{v}, {ratio}x")
            for a, b in pairs:
                rhos = sorted(k[2] for k in pts if k[0] == sl and k[1] == ratio and k[3] == a and (sl, ratio, k[2], b) in pts)
                changes = [paired_change(pts[(sl, ratio, r, a)], pts[(sl, ratio, r, b)]) for r in rhos]
                table += [[sl, ratio, f"{r:g}", f"{a} vs {b} (%)", f"{c.mean:.6g}", f"{c.ci:.6g}", str(c.n)] for r, c in zip(rhos, changes)]
                bottom.errorbar(rhos, [c.mean for c in changes], yerr=[c.ci for c in changes], color=f"C{ci_}", capsize=2,
                                marker="o", markersize=3, label=f"{a} vs {b}, {ratio}x")
        top.set_xscale("log")
        top.set_title(f"(β1, β2) = {sl}", fontsize=9)
        bottom.set_xlabel("ρ (zCDP)")
        top.legend(fontsize=6)
        bottom.legend(fontsize=6)
    axes[0][0].set_ylabel("test MSPE, smallest group")
    axes[1][0].set_ylabel("change of its MSPE (%), paired")
    fig.suptitle(spec.title, fontsize=10)
    fig.tight_layout()
    with open(out_dir / f"{spec.name}.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(table)
    return [*save(fig, out_dir, spec.name), out_dir / f"{spec.name}.csv"]
