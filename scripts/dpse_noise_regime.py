"""DPSE against DPNoSE where the privacy noise matters (docs/dpse.md, section 5): per group, the
noise-free fit, DPNoSE and DPSE test MSPE (mean ± 95 % CI over seeds) and the paired relative
changes, from the summary.json files of ``raco train -m ... tracking=none`` multiruns.

    python scripts/dpse_noise_regime.py outputs/multiruns/<day>/<time> [...] [--reference-rho 10000]

The noise-free fit is DPNoSE (``method.options.allocation=uniform``) at ``--reference-rho``; every
other rho gets a table.  A seed draws the mixture, so the same seed is the same data under every
variant and every rho: the changes are paired by seed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from raco_cli.figures.group_mspe import paired_change
from raco_cli.figures.pareto import mean_ci


def load(dirs: list[str]) -> tuple[dict[tuple[float, str], dict[str, dict[int, float]]], dict[float, list[dict]]]:
    """``(rho, "DPSE" | "DPNoSE") -> group -> {seed: test MSPE}``, and per rho the stats of the
    DPSE runs (budget weights, the stage-1 fallback to uniform weights)."""
    out: dict[tuple[float, str], dict[str, dict[int, float]]] = {}
    stats: dict[float, list[dict]] = {}
    for d in dirs:
        for path in sorted(Path(d).rglob("summary.json")):
            s = json.loads(path.read_text())
            if s.get("method") != "dpse" or s.get("rho_target") is None:
                continue
            label = variant(s["hyperparameters"]["options"])
            if label is None:
                continue
            cell = out.setdefault((float(s["rho_target"]), label), {})
            if label == "DPSE":
                stats.setdefault(float(s["rho_target"]), []).append(s["stats"])
            for group, value in s["metrics"]["test"]["group_mspe"].items():
                if value is not None and math.isfinite(value):
                    cell.setdefault(group, {})[int(s["seed"])] = float(value)
    return out, stats


def allocation_line(stats: list[dict]) -> str:
    """How many DPSE runs tailored from their stage-1 standard errors (the rest fell back to
    uniform weights: a noisy residual sum <= 0 or a singular precursor), and their weights."""
    tailored = [s["budget_weights"] for s in stats if not s.get("se_fallback")]
    if not tailored:
        return f"DPSE: stage 1 fell back to uniform weights (0.2 each) in {len(stats)} of {len(stats)} runs"
    w = sorted(tailored[0])
    lo = {g: min(t[g] for t in tailored) for g in w}
    hi = {g: max(t[g] for t in tailored) for g in w}
    spread = ", ".join(f"{g} {lo[g]:.3f}-{hi[g]:.3f}" for g in w)
    return (f"DPSE: tailored weights in {len(tailored)} of {len(stats)} runs (the rest fell back to uniform), "
            f"weight range over those runs: {spread}")


def variant(options: dict) -> str | None:
    """DPSE (``allocation=sum``, the paper's) or DPNoSE (``uniform``) with the paper-table defaults;
    None for any other variant (another allocation, the penalty, a non-default reading)."""
    defaults = {"bgl_penalty": 0.0, "group_objective": "pooled", "residual_clip": "delta_squared", "init": "model"}
    if any(options.get(k, v) != v for k, v in defaults.items()):
        return None
    return {"sum": "DPSE", "uniform": "DPNoSE"}.get(options.get("allocation", ""))


def fmt(values: dict[int, float]) -> str:
    m = mean_ci(list(values.values()))
    return "-" if m.n == 0 else f"{m.mean:.2f} ± {m.ci:.2f}"


def change(a: dict[int, float], b: dict[int, float]) -> str:
    c = paired_change(a, b)
    return "-" if c.n == 0 else f"{c.mean:+.1f} ± {c.ci:.1f}"


def difference(a: dict[int, float], b: dict[int, float]) -> str:
    """Mean ± 95 % CI of the paired absolute difference a - b."""
    m = mean_ci([a[s] - b[s] for s in sorted(set(a) & set(b))])
    return "-" if m.n == 0 else f"{m.mean:+.2f} ± {m.ci:.2f}"


def lower(a: dict[int, float], b: dict[int, float]) -> str:
    """On how many of the shared seeds a is below b."""
    seeds = sorted(set(a) & set(b))
    return f"{sum(a[s] < b[s] for s in seeds)} of {len(seeds)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="multirun (or run) directories holding summary.json files")
    parser.add_argument("--reference-rho", type=float, default=1e4, help="rho of the noise-free DPNoSE fit")
    args = parser.parse_args()
    cells, stats = load(args.dirs)
    ref = cells.get((args.reference_rho, "DPNoSE"), {})
    for rho in sorted({r for r, _ in cells if not math.isclose(r, args.reference_rho)}):
        nose, se = cells.get((rho, "DPNoSE"), {}), cells.get((rho, "DPSE"), {})
        seeds = {s for g in nose.values() for s in g} & {s for g in se.values() for s in g}
        seeds &= {s for g in ref.values() for s in g}  # every column over the same seeds
        nose, se = ({g: {s: v for s, v in by.items() if s in seeds} for g, by in cell.items()} for cell in (nose, se))
        base = {g: {s: v for s, v in by.items() if s in seeds} for g, by in ref.items()}
        if not seeds:
            continue
        print(f"\nrho = {rho:g}: {len(seeds)} seeds, every column over the same; test MSPE mean ± 95 % CI; changes in %, paired by seed")
        if stats.get(rho):
            print(allocation_line(stats[rho]))
        print()
        print("| group | noise-free fit | DPNoSE | DPNoSE vs noise-free, % | DPSE | DPSE vs DPNoSE, % | DPSE - DPNoSE | DPSE lower |")
        print("|---|---|---|---|---|---|---|---|")
        for group in sorted(nose, key=lambda g: (len(g), g)):
            print(f"| {group} | {fmt(base.get(group, {}))} | {fmt(nose[group])} | {change(nose[group], base.get(group, {}))} "
                  f"| {fmt(se.get(group, {}))} | {change(se.get(group, {}), nose[group])} "
                  f"| {difference(se.get(group, {}), nose[group])} | {lower(se.get(group, {}), nose[group])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
