"""The ``raco`` entry point: dispatch to sub-commands, with lazy imports (instant --help).

A :class:`RacoError` from any sub-command prints one line to stderr and exits with 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from raco_cli.errors import ConfigError, RacoError

USAGE = """\
usage: raco <command> [options]

Differentially private learning under rate constraints (RaCO-DP and baselines).

commands:
  train [overrides]     train one model (Hydra overrides; --multirun/-m for sweeps,
                        +sweep=<figure> for a paper sweep)
  tune [overrides]      hyperparameter search (Optuna, paper App. E.2) + retrain over seeds
  figures [NAME ...]    paper figures from MLflow -> outputs/figures/ (PNG + PDF)
  report EXPERIMENT     Pareto table and hard-constraint satisfaction of an experiment
  report --reproduction every reproduced figure: ours next to the paper's (docs/reproduction.md)
  privacy epsilon|steps privacy accounting calculator (dp-accounting PLD)
  data list|fetch|info|describe
                        datasets: presence, download + checksum, split statistics;
                        describe FILE: a starting config for your own table
  predict RUN --data F --out P
                        predictions of a dataset=table model for new rows
  audit [overrides]     empirical privacy audit: eps lower bound vs accounted eps
  runs stale            find (and mark FAILED) MLflow runs whose process is gone

examples:
  raco train dataset=adult constraint=dp eps=1
  raco train --multirun eps=0.5,1,2 seed=0,1,2 hydra/launcher=joblib
  raco train +sweep=fig4_adult hydra.sweeper.smoke=true      # = SMOKE=1 make sweep-fig4_adult
  raco figures fig4_adult && raco report fig4_adult
  raco tune dataset=adult constraint=dp eps=1 constraint.gamma=0.05 tune.trials=20
  raco privacy epsilon --steps 1000 --sample-rate 0.01 --noise-multiplier 1 --hist-noise-multiplier 2 --delta 1e-5
  raco data list
  raco data describe people.csv --label approved --sensitive sex > myconf/dataset/people.yaml
  raco predict outputs/runs/2026-01-01/12-00-00 --data new_people.csv --out predictions.csv
  raco audit dataset=adult eps=1

`raco <command> --help` describes a command."""


def train_help() -> str:
    from raco_cli.cli.paths import GROUPS, group_options

    lines = [
        "usage: raco train [key=value ...] [group=option ...] [--multirun|-m] [--cfg job] [--hydra-help]",
        "",
        "Train one model with a Hydra-composed config (conf/config.yaml); summary.json goes to the",
        "run directory (outputs/runs/...), metrics and artifacts to MLflow (tracking.uri).",
        "",
        "config groups (group=option):",
    ]
    for group in GROUPS:
        opts = group_options(group)
        if opts and group != "sweep":
            lines.append(f"  {group:<11} {', '.join(opts)}")
    lines += [
        "",
        "paper sweeps (+sweep=NAME; grids, MLflow experiment: sweeps/NAME.yaml; make sweep-NAME;",
        "+sweep=NAME1,NAME2 runs several one after the other in one process, as make reproduce does):",
    ]
    for name in group_options("sweep"):
        lines.append(f"  {name:<20} {_sweep_summary(name)}")
    lines += [
        "  options: hydra.sweeper.smoke=true (tiny version)  hydra.sweeper.only=[raco_dp,...] (some grids)",
        "           hydra.sweeper.resume=false (re-run finished jobs)  hydra/launcher=local|joblib|slurm|submitit_local",
    ]
    lines += [
        "",
        "top-level keys (the defaults of raco_cli/conf):",
        *_default_keys(),
        "",
        "examples:",
        "  raco train dataset=adult constraint=dp eps=1",
        "  raco train method=dp_sgd constraint=none eps=2 seed=3",
        "  raco train constraint=eo constraint.gamma=0.05       # also fnr, fpr, eop, custom (conf/constraint/)",
        "  raco train constraint=dp+fnr constraint.families.fnr.gamma=0.2   # several constraints in one run",
        "  raco train --multirun constraint.gamma=0.02,0.05,0.1 seed=0,1 hydra/launcher=joblib",
        "  raco train --cfg job            # print the composed config and exit",
    ]
    return "\n".join(lines)


def _default_keys() -> list[str]:
    """The help's lines of defaults, read from the packaged configs (:mod:`raco_cli.defaults`)."""
    from raco_cli import defaults

    root, method = defaults.root_defaults(), defaults.method_defaults("raco_dp")
    gamma = defaults.group_defaults("constraint", "dp").get("gamma")
    uri = defaults.group_defaults("tracking", "mlflow").get("uri")
    steps = "null (from budget)" if method.get("steps") is None else method.get("steps")
    return [f"  eps={root.get('eps')}  delta={root.get('delta')}  seed={root.get('seed')}  device={root.get('device')}  "
            f"privacy.scope={(root.get('privacy') or {}).get('scope')}  method.sampling={method.get('sampling')}|shared",
            f"  constraint.gamma={gamma}  method.steps={steps}  method.batch_size={method.get('batch_size')}  tracking.uri={uri}"]


def _sweep_summary(name: str) -> str:
    """First comment line of a sweep file (its one-line description)."""
    from raco_cli.cli.paths import SWEEPS_DIR

    for line in (SWEEPS_DIR / f"{name}.yaml").read_text().splitlines():
        if line.startswith("# ") and "@package" not in line:
            return line[2:].strip()
    return ""


# Hydra's mutually exclusive run modes, by flag
MODE_FLAGS = {"--run": "--run", "-r": "--run", "--multirun": "--multirun", "-m": "--multirun", "--cfg": "--cfg",
              "-c": "--cfg", "--info": "--info", "-i": "--info", "--shell-completion": "--shell-completion",
              "-sc": "--shell-completion"}  # fmt: skip


def _train(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(train_help())
        return 0
    names = sweep_names(argv)
    if len(names) > 1:
        return _train_sweeps(argv, names)
    return _train_one(argv)


def sweep_names(argv: Sequence[str]) -> list[str]:
    """The sweep files ``+sweep=a,b,...`` names (empty without one).

    >>> sweep_names(["+sweep=fig4_adult, fig5_heart", "seed=0"])
    ['fig4_adult', 'fig5_heart']
    """
    for a in argv:
        if a.startswith("+sweep="):
            return [name.strip() for name in a[len("+sweep="):].split(",") if name.strip()]
    return []


def _train_sweeps(argv: list[str], names: list[str]) -> int:
    """``raco train +sweep=a,b,...``: the sweeps one after another in this process, with the same
    overrides.  Their parallel workers (joblib's processes) stay up from one sweep to the next,
    so torch, MLflow and the datasets are loaded once, not once per sweep (~10 s a sweep on 2
    cores; ``make reproduce`` runs its 12 sweeps this way).  Every sweep is validated before
    any runs; a sweep whose jobs fail does not stop the next; the exit code is 1 when any did.
    A ``hydra.sweep.dir`` given on the command line gets the sweep's name appended, so the
    sweeps' run directories (``<sweep dir>/<job number>``) never overwrite each other."""
    import time
    import traceback

    from raco_cli.cli.overrides import expand_shorthands

    def one(name: str, a: str) -> str:
        if a.startswith("+sweep="):
            return f"+sweep={name}"
        if a.startswith("hydra.sweep.dir="):  # each sweep in its own directory under the one given
            return f"{a.rstrip('/')}/{name}"
        return a

    per_sweep = [expand_shorthands([one(name, a) for a in argv]) for name in names]
    for args in per_sweep:
        _validate(args)
    failed, took = [], []
    for i, (name, args) in enumerate(zip(names, per_sweep), start=1):
        print(f"== raco train: sweep {name} ({i} of {len(names)})", file=sys.stderr, flush=True)
        tic = time.perf_counter()
        try:
            code = _train_one(args, validated=True)
        except SystemExit as exc:  # Hydra's own exits (e.g. a launcher refusing a job)
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 - a bug in one sweep: its traceback, then the next sweep
            traceback.print_exc()
            code = 1
        took.append(f"{name} {_minutes(time.perf_counter() - tic)}")
        if code:
            failed.append(name)
    print(f"raco train: {len(names)} sweeps: {', '.join(took)}", file=sys.stderr)
    if failed:
        print(f"error: sweep(s) with failed jobs: {', '.join(failed)} (their errors are above). "
              "Run the same command again to retry only the unfinished jobs.", file=sys.stderr)
        return 1
    return 0


def _minutes(seconds: float) -> str:
    """``1 min 05 s`` / ``42 s``."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def _validate(argv: list[str]) -> None:
    """Every config a command would train, validated before anything is created (one line,
    exit 2); the run or sweep directory writable."""
    from raco_cli.cli.validate import prevalidate

    prevalidate(argv)
    from raco_cli.cli.train_cmd import output_root
    from raco_cli.run.train import check_writable

    check_writable(output_root(argv))  # before Hydra creates anything: one line, exit 2


def _train_one(argv: list[str], *, validated: bool = False) -> int:
    argv = ["--help" if a == "--hydra-help" else a for a in argv]
    modes = sorted({MODE_FLAGS[a] for a in argv if a in MODE_FLAGS})
    if len(modes) > 1:  # Hydra would raise a ValueError with a traceback
        raise ConfigError(f"raco train takes one of {', '.join(sorted(set(MODE_FLAGS.values())))} (got {' and '.join(modes)}). "
                          "To see a sweep job's config, drop --multirun: raco train <overrides> --cfg job.")
    from raco_cli.cli.overrides import expand_shorthands

    argv = expand_shorthands(argv)
    info_only = any(a in ("--cfg", "-c", "--info", "--help", "--resolve", "--shell-completion") for a in argv)
    if not info_only and not validated:
        _validate(argv)
    from raco_cli.cli.sweeper import LAST_SWEEP
    from raco_cli.cli.train_cmd import hydra_entry

    LAST_SWEEP.clear()  # (one process may run several sweeps)
    sys.argv = ["raco train", *argv]
    hydra_entry()
    if LAST_SWEEP.get("failed"):  # the other jobs ran; scripts still learn that some did not
        print(f"error: {LAST_SWEEP['failed']} of {LAST_SWEEP['jobs']} sweep jobs failed (recorded FAILED in MLflow; "
              "their errors are above). Run the same command again to retry only the unfinished jobs.", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv[0] in ("-V", "--version"):
        from raco_cli import __version__

        print(f"raco {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    try:
        if command == "train":
            return _train(rest)
        if command in ("figures", "report"):
            from raco_cli.cli import figures_cmd

            return figures_cmd.main(command, rest)
        if command == "tune":
            from raco_cli.cli import tune_cmd

            return tune_cmd.main(rest)
        if command == "privacy":
            from raco_cli.cli import privacy_cmd

            return privacy_cmd.main(rest)
        if command == "data":
            from raco_cli.cli import data_cmd

            return data_cmd.main(rest)
        if command == "predict":
            from raco_cli.cli import predict_cmd

            return predict_cmd.main(rest)
        if command == "audit":
            from raco_cli.cli import audit_cmd

            return audit_cmd.main(rest)
        if command == "runs":
            from raco_cli.cli import runs_cmd

            return runs_cmd.main(rest)
    except RacoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # finished runs, trials and files are kept; the same command resumes
        print(f"raco {command}: interrupted. Finished work is kept; run the same command again to resume.", file=sys.stderr)
        return 130
    print(f"error: unknown command '{command}'. Available: audit, data, figures, predict, privacy, report, runs, train, tune. See raco --help.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
