"""``raco train``: the Hydra application.

Hydra composes the config and picks the launcher; each job lands in :func:`hydra_entry`'s task,
which hands it, as plain dicts (:mod:`raco_cli.cli.job_config`), to the run layer
(:func:`raco_cli.run.train.train`, or
:func:`raco_cli.run.group.run_group_file` for a sweep group job) and prints the result table
(:mod:`raco_cli.cli.result_table`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raco_cli.errors import RacoError

log = logging.getLogger(__name__)


def output_root(args: list[str]) -> Path:
    """The fixed part of the run (or sweep) directory of ``raco train`` overrides.

    ``hydra.run.dir`` / ``hydra.sweep.dir`` up to the first interpolation (``${now:...}``),
    else ``outputs/runs`` / ``outputs/multiruns`` (conf/hydra/default.yaml).
    """
    multirun = any(a in ("--multirun", "-m") for a in args)
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    value = next((a[len(key) :] for a in args if a.startswith(key)), None)
    if value is None:
        return Path("outputs/multiruns" if multirun else "outputs/runs")
    fixed = value.split("${", 1)[0]
    return Path(fixed) if fixed.endswith("/") or "${" not in value else Path(fixed).parent


def hydra_entry() -> None:
    """Run the Hydra application on ``sys.argv`` (``train`` already stripped)."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig, OmegaConf

    from raco_cli.cli.job_config import plain_job
    from raco_cli.cli.paths import CONF_DIR
    from raco_cli.cli.plugins import register_resolvers
    from raco_cli.cli.result_table import print_result
    from raco_cli.run.records import record_job_failure
    from raco_cli.run.train import train

    register_resolvers()

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def _task(cfg: DictConfig) -> float | None:
        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        multirun = hc.mode == RunMode.MULTIRUN
        sweep_dir = Path(hc.sweep.dir) if multirun else None
        group = OmegaConf.select(cfg, "raco_group", default=None)
        if group is not None:  # a sweep group job (raco_cli/run/group.py): its runs' configs are in the file
            from raco_cli.run.group import run_group_file

            return run_group_file(Path(str(group)), sweep_dir=sweep_dir, on_result=print_result)  # type: ignore[return-value]
        job: Mapping[str, Any] = cfg  # the DictConfig until it is converted (a failed conversion is the job's error)
        try:
            job = plain_job(cfg)
            summary = train(job, run_dir=run_dir, sweep_dir=sweep_dir)
        except RacoError as exc:
            print(f"error: {exc}", file=sys.stderr)
            if multirun:  # one bad job must not stop the sweep; its failure is recorded
                record_job_failure(job, run_dir, sweep_dir, exc)
                return None
            raise SystemExit(2) from None
        except Exception as exc:  # a bug: keep the traceback; in a sweep, record and go on
            if not multirun:
                raise
            log.exception("job failed")
            print(f"error: job {hc.job.num} failed: {type(exc).__name__}: {exc} (traceback in {run_dir})", file=sys.stderr)
            record_job_failure(job, run_dir, sweep_dir, exc)
            return None
        print_result(summary, run_dir)
        # the job's value for an optimising sweeper: validation accuracy; NaN in scope=model,
        # which writes no exact validation statistic (None would mean "failed" to the sweeper)
        val = summary["metrics"].get("val")
        if val is None:
            return float("nan")
        return -float(val["mspe"]) if "mspe" in val else float(val["accuracy"])  # higher is better

    _task()
