"""What the SLURM client tells a sweep, read for the launcher (:mod:`raco_cli.cli.slurm`):
sbatch's refusals as one line naming the ``hydra.launcher`` keys, and job states from
``squeue`` where ``sacct`` (accounting) is unavailable.
"""

from __future__ import annotations

import functools
import logging
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from raco_cli.errors import ConfigError

log = logging.getLogger(__name__)

# sbatch's reason for refusing a job (a fragment of its stderr, matched case-insensitively)
# -> the hydra.launcher keys that decide it; the first match wins
REFUSALS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("memory specification can not be satisfied", ("mem_gb", "mem_per_cpu", "mem_per_gpu")),
    ("invalid partition", ("partition",)),
    ("more processors requested than permitted", ("cpus_per_task", "tasks_per_node", "nodes")),
    ("invalid generic resource", ("gpus_per_node", "gpus_per_task", "gres")),
    ("invalid feature specification", ("constraint",)),
    ("node count specification invalid", ("nodes",)),
    ("time limit", ("timeout_min",)),
    ("invalid qos", ("qos",)),
    ("invalid account", ("account",)),
    ("requested node configuration is not available",
     ("cpus_per_task", "mem_gb", "gpus_per_node", "nodes", "tasks_per_node", "constraint", "exclude")),
)  # fmt: skip
NO_SBATCH = (
    "hydra/launcher=slurm needs the SLURM client (sbatch) on PATH, which this machine does not have. "
    "Run the sweep from a login node of the cluster, or on this machine with hydra/launcher=joblib."
)


def partitions_summary() -> str:
    """The cluster's partitions as ``sinfo`` reports them (``*`` marks the default), e.g.
    ``debug* (2 CPUs, 4096 MB per node)``; empty when ``sinfo`` cannot tell."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P|%c|%m|%G"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if out.returncode:
        return ""
    parts = []
    for line in out.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        name, cpus, mem, gres = fields
        gpus = "" if gres in ("(null)", "") else f", {gres}"
        parts.append(f"{name} ({cpus} CPUs, {mem} MB per node{gpus})")
    return ", ".join(dict.fromkeys(parts))


def refusal(stderr: str, params: Mapping[str, Any], partitions: str = "") -> ConfigError:
    """One line for sbatch refusing the sweep's job array: its reason, the ``hydra.launcher``
    keys that decide it with their values, what the cluster offers and what to change.

    >>> print(refusal("sbatch: error: invalid partition specified: gpu\\nsbatch: error: Batch job "
    ...               "submission failed: Invalid partition name specified", {"partition": "gpu"}, "debug* (2 CPUs, 4096 MB per node)"))
    SLURM refused the sweep's jobs (sbatch: invalid partition specified: gpu; Batch job submission failed: Invalid partition name specified): hydra.launcher.partition=gpu. Partitions: debug* (2 CPUs, 4096 MB per node). Change hydra.launcher.partition to fit them (null: the cluster's default partition).
    """
    reasons = [line.split("error:", 1)[1].strip() for line in stderr.splitlines() if "error:" in line]
    reason = "; ".join(reasons) or " ".join(stderr.split()) or "no reason given"
    keys = next((k for fragment, k in REFUSALS if fragment in reason.lower()), ())
    shown = [f"hydra.launcher.{k}={_value(params.get(k))}" for k in keys if params.get(k) is not None or k == "partition"]
    where = f"Partitions: {partitions}. " if partitions else "See the partitions with: sinfo -o '%P %c %m %G'. "
    if keys:
        fix = f"Change {' or '.join(f'hydra.launcher.{k}' for k in keys)} to fit them"
        fix += " (null: the cluster's default partition)." if "partition" in keys else " (mem_gb is in GB)." if "mem_gb" in keys else "."
    else:
        fix = "Check the hydra.launcher.* settings of conf/hydra/launcher/slurm.yaml against them."
    return ConfigError(f"SLURM refused the sweep's jobs (sbatch: {reason})" + (f": {', '.join(shown)}. " if shown else ". ")
                       + where + fix)


def _value(value: Any) -> str:
    return "null" if value is None else str(value)


def squeue_states(output: str) -> dict[str, dict[str, str]]:
    """Job states from ``squeue -h -o '%i|%T|%r'`` lines, keyed as submitit keys them
    (``<array job>_<task>``; pending ranges such as ``7_[1-3%2]`` expanded).

    >>> sorted((k, v["State"]) for k, v in squeue_states("7_[1-2%2]|PENDING|None\\n7_0|RUNNING|None\\n").items())
    [('7_0', 'RUNNING'), ('7_1', 'PENDING'), ('7_2', 'PENDING')]
    """
    from submitit.slurm.slurm import SlurmInfoWatcher

    return SlurmInfoWatcher().read_info("JobID|State|Reason\n" + output)


# a job squeue no longer lists has ended (it drops ended jobs after MinJobAge, 300 s by default)
GONE = "ENDED (no longer listed by squeue)"


@functools.cache
def fallback_watcher_class() -> type:
    """:class:`AccountingFallbackWatcher`, defined on first use (submitit is imported lazily)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class AccountingFallbackWatcher(SlurmInfoWatcher):
        """Job states from ``sacct``, else from ``squeue`` with a single warning.

        submitit's watcher only knows ``sacct``; without accounting it warns at every poll and
        reports every job UNKNOWN (= not done), so a task that ended without a result is waited
        for forever.  ``squeue --states=all`` lists pending, running and recently ended jobs;
        a registered job it no longer lists has ended.
        """

        def __init__(self, delay_s: int = 600) -> None:
            super().__init__(delay_s=delay_s)
            self.sacct = True  # until sacct fails once

        def update(self) -> None:
            command = self._make_command()
            if command is None:
                return
            self._num_calls += 1
            info = self._sacct(command) if self.sacct else None
            if info is None:
                ids = sorted({x.split("_")[0] for x in self._registered - self._finished})
                info = self._squeue(ids)
            if info is not None:
                self._info_dict.update(info)
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

        def _sacct(self, command: list[str]) -> dict[str, dict[str, str]] | None:
            try:
                out = subprocess.run(command, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as exc:
                reason = str(exc)
            else:
                if out.returncode == 0:
                    return self.read_info(out.stdout)
                reason = " ".join(out.stderr.split()) or f"exit code {out.returncode}"
            self.sacct = False
            log.warning("SLURM accounting is unavailable (sacct: %s); job states come from squeue for the rest "
                        "of this sweep.", reason)
            return None

        def _squeue(self, ids: list[str]) -> dict[str, dict[str, str]] | None:
            if not ids:
                return {}
            command = ["squeue", "-h", "--states=all", "-o", "%i|%T|%r", "-j", ",".join(ids)]
            try:
                out = subprocess.run(command, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.debug("squeue failed: %s", exc)
                return None
            if out.returncode and "invalid job id" not in out.stderr.lower():  # controller busy: ask again later
                log.debug("squeue failed: %s", out.stderr.strip())
                return None
            info = squeue_states("" if out.returncode else out.stdout)
            for job_id in self._registered - self._finished:
                info.setdefault(job_id, {"State": GONE})
            return info

    return AccountingFallbackWatcher


def raised(message: str) -> str:
    """The exception line (``Type: message``) of the trace in a submitit FailedJobError.

    >>> raised("Job (task=0) failed during processing with trace:\\n" + "-" * 22 + "\\nTraceback ...\\n"
    ...        "  File x\\nKeyError: 'seed'\\n" + "-" * 22 + "\\nYou can check full logs")
    "KeyError: 'seed'"
    """
    parts = message.split("-" * 22)
    lines = [line.strip() for line in (parts[1] if len(parts) > 2 else message).splitlines() if line.strip()]
    return lines[-1] if lines else "an error"
