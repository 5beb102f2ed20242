"""``raco runs stale``: MLflow runs left RUNNING by a process that is gone.

A run killed with SIGKILL (or by the OOM killer, or a lost node) cannot mark itself FAILED.
Every new ``raco train`` run marks such runs of its experiment FAILED before it starts (tag
``raco.stale_reason``); this command does the same on demand.  Detection, by the run's lock
file ``.raco-locks/<run_id>.lock`` beside the store (outside the records; a private
``scope=model`` run has no process tags) or, without one, by the run's tags: on the same host,
the lock is no longer held and the recorded pid and process start time no longer exist; on
another host, no heartbeat (the lock's mtime, refreshed every minute) for ``RACO_STALE_AFTER_S``
seconds (default 900).
"""

from __future__ import annotations

import argparse

from raco_cli.errors import ConfigError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raco runs", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("stale", help="list RUNNING runs whose process is gone; --mark marks them FAILED")
    p.add_argument("--uri", default="sqlite:///outputs/mlflow.db", help="MLflow tracking URI")
    p.add_argument("--experiment", default="raco", help="MLflow experiment name")
    p.add_argument("--mark", action="store_true", help="mark them FAILED (default: only list)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            return 0
        raise ConfigError("Invalid arguments for raco runs; see raco runs --help.") from None
    from raco_cli.tracking.mlflow_store import client, lock_dir, mark_stale_runs
    from raco_cli.tracking.retry import retrying

    c = client(args.uri)
    exp = retrying(c.get_experiment_by_name, args.experiment)
    if exp is None:
        print(f"no experiment '{args.experiment}' in {args.uri}")
        return 0
    marked = mark_stale_runs(c, exp.experiment_id, dry_run=not args.mark, locks=lock_dir(args.uri))
    for run_id, reason in marked:
        print(f"{run_id}  {'marked FAILED' if args.mark else 'stale'}: {reason}")
    print(f"{len(marked)} stale run(s)")
    return 0
