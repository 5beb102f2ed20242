"""``raco predict``: apply a model trained on ``dataset=table`` to new rows.

    raco predict RUN_DIR_OR_MLFLOW_URI --data new.csv --out predictions.csv [--keep id] [--tracking-uri URI]

The model is a run directory (``outputs/runs/<date>/<time>``), its ``model/`` folder, or an
MLflow model URI (``models:/<model_id>``, ``runs:/<run_id>/model``, a registered
``models:/<name>/<version>`` or ``models:/<name>/@<alias>``; the store is
``--tracking-uri``, default ``$MLFLOW_TRACKING_URI`` or ``sqlite:///outputs/mlflow.db``).
``new.csv`` (CSV, gzip CSV or Parquet) needs the feature columns the model was trained on;
the sensitive columns (for the ``group`` column) and the label are optional: with the label,
it prints the accuracy, rates per group and the run's constraint on those rows and writes
them as JSON (``--report``, default ``<out>.report.json``).  The output has ``predicted``, ``prob_<class>`` per class and ``group``, one row
per input row, in order, after the ``--keep`` columns.  Bad input is one line, exit 2, and
leaves an existing output file untouched.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from raco_cli.cli.args import OneLineParser
from raco_cli.errors import ConfigError, DataNotFoundError, OutputError, TrackingError

DEFAULT_TRACKING_URI = "sqlite:///outputs/mlflow.db"  # conf/tracking/mlflow.yaml


class _Parser(OneLineParser):
    command = "raco predict"


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raco predict", description="Predictions of a model trained on dataset=table for new rows "
                                                 "(docs/your-own-data.md).")
    p.add_argument("model", metavar="RUN_DIR_OR_MLFLOW_URI",
                   help="a run directory, its model/ folder, or an MLflow URI: models:/<model_id>, runs:/<run_id>/model, "
                        "models:/<name>/<version or @alias>")
    p.add_argument("--data", required=True, help="the new rows: CSV (plain or .gz) or Parquet with the feature columns")
    p.add_argument("--out", required=True, help="where to write the predictions (CSV)")
    p.add_argument("--keep", action="append", default=[], metavar="COLUMN",
                   help="an input column to copy into the output (e.g. an id); repeatable")
    p.add_argument("--report", default=None, metavar="PATH",
                   help="with a label column in --data: where to write the per-group report as JSON "
                        "(default: --out with .report.json, e.g. predictions.report.json)")
    p.add_argument("--tracking-uri", default=None,
                   help=f"MLflow store of a models:/ or runs:/ URI (default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})")
    return p


def locate(source: str, tracking_uri: str | None) -> Path:
    """The artifact directory of a run directory or an MLflow model URI (downloaded).

    Raises:
        DataNotFoundError: no such directory, or no raco model in it.
        TrackingError: the MLflow store or the model cannot be read.
    """
    from raco_cli import predictor

    local = Path(source).expanduser()
    if local.exists():
        return predictor.find(local)
    if not source.startswith(("models:/", "runs:/", "mlflow-artifacts:/")):
        raise DataNotFoundError(f"{source} is neither a directory nor an MLflow model URI; give a run directory "
                                "(outputs/runs/<date>/<time>), models:/<model_id> or runs:/<run_id>/model.")
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise TrackingError(f"No MLflow store at {uri} for {source}; give the store with --tracking-uri "
                            "(the tracking.uri the run was trained with).")
    if source.startswith("runs:/") and source.rstrip("/").count("/") == 1:
        source = source.rstrip("/") + "/model"
    from raco_cli.tracking.model_artifact import download, logged_model_location

    try:
        source = logged_model_location(source, uri)
        path = download(source, uri, tempfile.mkdtemp(prefix="raco-predict-"))
    except Exception as exc:  # noqa: BLE001 - MLflow raises many types for an unknown run/model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrackingError(f"Cannot fetch {source} from {uri}: {first}. Check the URI (raco train prints it as "
                            "'mlflow model') and --tracking-uri.") from None
    return predictor.find(path)


def _write(write: Any, out: Path, what: str, flag: str) -> None:
    """Write atomically, with the mode of every other file (:mod:`raco_cli.tracking.files`):
    a failure leaves an existing file as it was."""
    from raco_cli.tracking.files import atomic_write

    try:
        atomic_write(out, write, suffix=".part", newline="")
    except OSError as exc:
        raise OutputError(f"Cannot write the {what} to {out}: {exc.strerror or exc}. Choose a writable {flag}.") from None


def report_path(out: Path) -> Path:
    """The default ``--report``: ``predictions.csv`` -> ``predictions.report.json``.

    >>> str(report_path(Path("a/predictions.csv"))), str(report_path(Path("p")))
    ('a/predictions.report.json', 'p.report.json')
    """
    return out.with_name((out.name[: -len(out.suffix)] if out.suffix else out.name) + ".report.json")


def report_lines(report: dict[str, Any], class_names: Any) -> list[str]:
    """The per-group report as lines of the summary ``raco predict`` prints."""
    lines = []
    positive = class_names[-1] if len(class_names) == 2 else None
    width = max((len(str(g)) for g in report["groups"]), default=0)
    for name, g in report["groups"].items():
        if not g["rows"]:
            lines.append(f"  group {name:<{width}}  0 rows")
            continue
        rates = (f"predicted {positive} {g['predicted'][positive]:.4f}" if positive is not None else
                 "predicted " + ", ".join(f"{c} {v:.4f}" for c, v in g["predicted"].items()))
        extra = "".join(f", {k.upper()} {g[k]:.4f}" for k in ("tpr", "fpr") if g.get(k) is not None)
        lines.append(f"  group {name:<{width}}  {g['rows']} rows: accuracy {g['accuracy']:.4f}, {rates}{extra}")
    c = report.get("constraint")
    if c is not None:
        fams = ", ".join(f"{f} (gamma {min(v['gamma']):g}): {v['max_hard']:.4f}" for f, v in c["families"].items())
        lines.append(f"  constraint  {fams} (max over its rate constraints, hard predictions on {report['rows_with_group']} rows): "
                     + ("satisfied" if c["satisfied"] else f"violated by {c['max_violation_hard']:.4f}"))
    return lines


def main(argv: list[str]) -> int:
    import pandas as pd

    from raco_cli.data.table import format_counts, read_table
    from raco_cli.predictor import Predictor

    args = parser().parse_args(argv)
    data, out = Path(args.data).expanduser(), Path(args.out).expanduser()
    if out.exists() and data.exists() and out.resolve() == data.resolve():
        raise ConfigError(f"--out {args.out} is the --data file; write the predictions to another file.")
    model = Predictor.load(locate(args.model, args.tracking_uri))
    df = read_table(str(data), na_values=model.schema.na_values, key="--data")
    absent = [c for c in args.keep if c not in df.columns]
    if absent:
        raise ConfigError(f"--keep {absent[0]}: {args.data} has no such column. Columns: {', '.join(map(str, df.columns[:20]))}.")
    result = model.predict(df, where=str(args.data))
    clash = [c for c in args.keep if c in result.frame.columns]
    if clash:
        raise ConfigError(f"--keep {clash[0]}: the output has a column of that name; rename it in {args.data} or drop --keep.")
    frame = pd.concat([df[list(args.keep)].reset_index(drop=True), result.frame], axis=1) if args.keep else result.frame
    report = Path(args.report).expanduser() if args.report else report_path(out)
    if result.report is not None and report.exists() and data.exists() and report.resolve() == data.resolve():
        raise ConfigError(f"--report {report} is the --data file; write the report to another file.")
    _write(lambda fh: frame.to_csv(fh, index=False), out, "predictions", "--out")
    if result.report is not None:
        text = json.dumps({"data": str(args.data), "model": str(args.model), **result.report}, indent=1, allow_nan=False)
        _write(lambda fh: fh.write(text + "\n"), report, "report", "--report")
    run = model.run
    counts = Counter(result.frame["predicted"])
    print(f"raco predict: {len(frame)} rows of {args.data} -> {args.out}")
    eps = f"eps {run['eps_spent']:.4g} of {run['eps_target']:g}" if run.get("eps_spent") is not None else "not private"
    acc = f", test accuracy {run['test_accuracy']:.4f}" if isinstance(run.get("test_accuracy"), float) else ""
    print(f"  model       {model.model['name']}, {run.get('method', '?')} ({eps}, privacy scope {run.get('privacy_scope', '?')}, "
          f"preprocessing {run.get('preprocessing', '?')}){acc}")
    print("  predicted   " + ", ".join(f"{c} {counts.get(c, 0)}" for c in model.class_names))
    print("  columns     " + ", ".join(map(str, frame.columns)))
    if "group" not in result.frame.columns:
        print(f"  group       not written: {args.data} lacks the sensitive column(s) {', '.join(model.schema.groups.columns)}")
    if result.counts:
        print("  rules       " + format_counts(result.counts))
    if result.accuracy is not None:
        print(f"  accuracy    {result.accuracy:.4f} on {result.labelled} rows with a label ({model.schema.target.column})")
    if result.report is not None:
        for line in report_lines(result.report, model.class_names):
            print(line)
        print(f"  report      {report}")
    if result.group_unknown or result.group_missing:
        import sys

        groups = model.schema.groups
        print(f"warning: {result.group_unknown} rows hold a value of {', '.join(groups.columns)} outside the model's groups "
              f"({', '.join(model.group_names)}) and {result.group_missing} a missing one; their group column is empty.",
              file=sys.stderr)
    return 0
