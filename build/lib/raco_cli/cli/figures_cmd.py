"""``raco figures`` and ``raco report``: paper figures and Pareto tables from MLflow.

    raco figures [NAME ...] [--smoke] [--out DIR] [--no-log] [--small] [tracking.uri=URI]
    raco report EXPERIMENT [--all] [--x METRIC] [--out DIR] [--no-log] [tracking.uri=URI]
    raco report --reproduction [--smoke] [--doc FILE] [--wall-time SECONDS] [tracking.uri=URI]

Figures go to ``outputs/figures/<name>.{png,pdf}`` (tables also ``.md``/``.csv``) and are
logged as artifacts of the experiment's report run; ``--small`` writes palette PNGs only (no
PDF), the form committed under docs/figures by ``make reproduce``.  A figure without runs
fails with one line naming the sweep to run (exit 2); ``raco figures`` with no name draws
every figure that has runs and lists the others.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from raco_cli.cli.args import OneLineParser
from raco_cli.cli.paths import SWEEPS_DIR
from raco_cli.cli.tracking_uri import default_uri
from raco_cli.errors import NO_RUNS, ConfigError, NoRunsError, RacoError, unknown_name

if TYPE_CHECKING:
    from raco_cli.figures.published import PublishedPoint
    from raco_cli.figures.specs import FigureSpec

DEFAULT_OUT = Path("outputs/figures")
REPRODUCTION_DOC = Path("docs/reproduction.md")


def sweep_experiment(sweep: str) -> str:
    """The MLflow experiment a sweep file writes to (``tracking.experiment``)."""
    import yaml

    path = SWEEPS_DIR / f"{sweep}.yaml"
    if not path.exists():
        return sweep
    data = yaml.safe_load(path.read_text()) or {}
    return str((data.get("tracking") or {}).get("experiment") or sweep)


def _split(argv: list[str]) -> tuple[list[str], str | None]:
    uri = None
    rest = []
    for a in argv:
        if a.startswith("tracking.uri="):
            uri = a.split("=", 1)[1]
        else:
            rest.append(a)
    return rest, uri


def published_points(spec: FigureSpec) -> list[PublishedPoint]:
    """The published Lowy et al. 2023 points a figure overlays (none if it overlays none)."""
    from raco_cli.figures.published import load_published

    pub = spec.published
    if not pub:
        return []
    return [p for e in pub["eps"] for p in load_published(dataset=pub["dataset"], constraint=pub["constraint"], epsilon=e)]


def draw_figure(name: str, *, uri: str, out: Path, smoke: bool = False, log: bool = True, small: bool = False) -> list[Path]:
    """Draw one figure from its experiment (``small``: palette PNGs, no PDF).

    Raises:
        NoRunsError: the experiment has no finished runs (the message names the sweep).
    """
    from raco_cli.cli.sweep_plan import SMOKE_SUFFIX
    from raco_cli.figures import plots
    from raco_cli.figures.specs import FIGURES
    from raco_cli.tracking.mlflow_store import log_report_artifacts, run_records

    spec = FIGURES[name]
    experiment = sweep_experiment(spec.sweep) + (SMOKE_SUFFIX if smoke else "")
    records = run_records(uri, experiment)
    if not any(r["status"] == "FINISHED" for r in records):
        raise NoRunsError(
            NO_RUNS.format(what=f"figure {name}", experiment=experiment, uri=uri, sweep=spec.sweep,
                           smoke=" SMOKE=1" if smoke else "")
        )
    if spec.kind == "dro_gradnorm":  # Figure 1 plots each run's history, not its final values
        from raco_cli.figures.dro import HISTORY_KEYS
        from raco_cli.tracking.mlflow_store import metric_history

        for rec in records:
            if rec["status"] == "FINISHED":
                rec["history"] = {key: metric_history(uri, rec["run_id"], key) for key in HISTORY_KEYS}
    points = published_points(spec)
    name_out = f"{name}{SMOKE_SUFFIX}" if smoke else name
    from dataclasses import replace

    files = plots.draw(records, replace(spec, name=name_out), out, published=points)
    if small:
        for f in [f for f in files if f.suffix == ".pdf"]:
            f.unlink()
        files = [plots.shrink_png(f) if f.suffix == ".png" else f for f in files if f.suffix != ".pdf"]
    if log:
        log_report_artifacts(uri, experiment, files)
    return files


def figures_main(argv: list[str]) -> int:
    from raco_cli.figures.specs import FIGURES

    parser = OneLineParser(prog="raco figures", description="Draw paper figures from MLflow runs.")
    parser.add_argument("names", nargs="*", help=f"figures (default: all): {', '.join(FIGURES)}")
    parser.add_argument("--smoke", action="store_true", help="read the SMOKE=1 experiments (<experiment>_smoke)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default outputs/figures)")
    parser.add_argument("--no-log", action="store_true", help="do not log the files to MLflow")
    parser.add_argument("--small", action="store_true", help="128-colour PNGs and no PDF (for committing, as docs/figures)")
    rest, uri = _split(argv)
    args = parser.parse_args(rest)
    uri = uri or default_uri()
    names = [n.removeprefix("fig-") if n.removeprefix("fig-") in FIGURES else n for n in args.names]
    for n in names:
        if n not in FIGURES:
            raise unknown_name("figure", n, FIGURES)
    if names:
        failed = 0
        for n in names:
            try:
                files = draw_figure(n, uri=uri, out=args.out, smoke=args.smoke, log=not args.no_log, small=args.small)
            except RacoError as exc:
                if len(names) == 1:
                    raise
                print(f"error: figure {n}: {exc}", file=sys.stderr)  # the other figures are still drawn
                failed += 1
                continue
            for f in files:
                print(f)
        return 2 if failed else 0
    drawn, missing = 0, []
    for n in FIGURES:
        try:
            files = draw_figure(n, uri=uri, out=args.out, smoke=args.smoke, log=not args.no_log, small=args.small)
        except NoRunsError:
            missing.append(n)
            continue
        drawn += 1
        for f in files:
            print(f)
    if not drawn:
        smoke = " SMOKE=1" if args.smoke else ""
        raise NoRunsError(
            f"No finished runs for any figure in {uri}. Run a sweep first, e.g. make sweep-fig4_adult{smoke} "
            "(make help lists them)."
        )
    if missing:
        print(f"skipped (no runs yet): {', '.join(missing)}; make sweep-<name> runs one", file=sys.stderr)
    return 0


def report_main(argv: list[str]) -> int:
    from raco_cli.figures.report import report
    from raco_cli.tracking.mlflow_store import log_report_artifacts, run_records

    parser = OneLineParser(prog="raco report", description="Pareto table and constraint satisfaction of an experiment.")
    parser.add_argument("experiment", nargs="?", help="MLflow experiment (a sweep's tracking.experiment, e.g. fig4_adult)")
    parser.add_argument("--all", action="store_true", help="list every configuration, not only the Pareto front")
    parser.add_argument("--x", default=None, help="constraint metric (default: from the runs' constraint: dp_gap, eo_gap, fnr)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the table is written (default outputs/figures)")
    parser.add_argument("--no-log", action="store_true", help="do not log the table to MLflow")
    parser.add_argument("--reproduction", action="store_true",
                        help="write every reproduced figure's table, ours next to the paper's (docs/reproduction.md)")
    parser.add_argument("--smoke", action="store_true", help="--reproduction: read the SMOKE=1 experiments")
    parser.add_argument("--doc", type=Path, default=None,
                        help="--reproduction: the document to update (default docs/reproduction.md; "
                             "with --smoke outputs/figures/reproduction_smoke.md)")
    parser.add_argument("--wall-time", type=float, default=None,
                        help="--reproduction: measured seconds of the sweeps and figures, written into the document")
    parser.add_argument("--sweeps", default=None,
                        help="--reproduction with --wall-time: the sweeps that were timed (space-separated; default all)")
    rest, uri = _split(argv)
    args = parser.parse_args(rest)
    uri = uri or default_uri()
    if args.reproduction:
        sweeps = args.sweeps.split() if args.sweeps else None
        return reproduction_main(uri, smoke=args.smoke, doc=args.doc, wall_time=args.wall_time, sweeps=sweeps)
    if not args.experiment:
        raise ConfigError("raco report: missing EXPERIMENT (e.g. raco report fig4_adult), or --reproduction for every figure")
    records = run_records(uri, args.experiment)
    if not any(r["status"] == "FINISHED" for r in records):
        sweep = args.experiment.removesuffix("_smoke")
        raise NoRunsError(
            NO_RUNS.format(what="a report", experiment=args.experiment, uri=uri, sweep=sweep,
                           smoke=" SMOKE=1" if args.experiment.endswith("_smoke") else "")
        )
    text = report(records, experiment=args.experiment, uri=uri, x_metric=args.x, all_points=args.all)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.experiment}_report.txt"
    path.write_text(text + "\n")
    if not args.no_log:
        log_report_artifacts(uri, args.experiment, [path])
    return 0


def planned_runs(sweep: str, *, smoke: bool) -> int:
    """How many runs a sweep file plans (its grids expanded; smoke axes with ``smoke``)."""
    import yaml

    from raco_cli.cli.sweep_plan import plan_jobs

    sweeper = ((yaml.safe_load((SWEEPS_DIR / f"{sweep}.yaml").read_text()) or {}).get("hydra") or {}).get("sweeper") or {}
    return len(plan_jobs(sweeper.get("grids"), sweeper.get("params"), [], smoke=smoke,
                         smoke_params=sweeper.get("smoke_params"), smoke_overrides=sweeper.get("smoke_overrides")))


def reproduction_main(
    uri: str, *, smoke: bool, doc: Path | None, wall_time: float | None, sweeps: list[str] | None = None
) -> int:
    """Update the reproduction document from the store; prints its path."""
    import os

    from raco_cli.cli.sweep_plan import SMOKE_SUFFIX
    from raco_cli.figures import reproduction
    from raco_cli.figures.specs import FIGURES
    from raco_cli.tracking.mlflow_store import run_records

    doc = doc or (DEFAULT_OUT / "reproduction_smoke.md" if smoke else REPRODUCTION_DOC)
    blocks: dict[str, str] = {}
    if wall_time is not None:
        blocks[reproduction.WALL_TIME] = reproduction.wall_time_line(wall_time, os.cpu_count(), smoke, sweeps or reproduction.REPRODUCED)
    cache: dict[str, list[dict]] = {}
    for name in reproduction.REPRODUCED:
        spec = FIGURES[name]
        experiment = sweep_experiment(spec.sweep) + (SMOKE_SUFFIX if smoke else "")
        if experiment not in cache:
            cache[experiment] = run_records(uri, experiment)
        points = published_points(spec)
        png = f"{name}{SMOKE_SUFFIX if smoke else ''}.png"
        image = next((f"{sub}{png}" for sub in ("", "figures/") if (doc.parent / sub / png).exists()), None)
        blocks[name] = reproduction.figure_block(
            name, cache[experiment], uri=uri, experiment=experiment, smoke=smoke, published=points, image=image,
            planned=planned_runs(spec.sweep, smoke=smoke))
    existing = doc.read_text() if doc.exists() else None
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(reproduction.render(blocks, existing))
    print(doc)
    return 0


def main(command: str, argv: list[str]) -> int:
    if command == "figures":
        return figures_main(argv)
    if command == "report":
        return report_main(argv)
    raise ConfigError(f"unknown command {command}")  # pragma: no cover


__all__ = ["main", "figures_main", "report_main", "draw_figure", "RacoError"]
