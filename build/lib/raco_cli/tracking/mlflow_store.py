"""The only module that talks to MLflow: run lifecycle, metrics, artifacts, sweep parents.

Every call goes through :func:`~raco_cli.tracking.retry.retrying`, because a SQLite store
shared by parallel jobs answers "database is locked" under contention; MLflow calls are
idempotent per run id (metrics carry their step and timestamp), so retrying cannot duplicate a
record that failed.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import math
import os
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raco_cli.errors import TrackingError
from raco_cli.methods.base import EvalRecord
from raco_cli.tracking.bulk_metrics import (
    create_runs_bulk,
    log_metrics_bulk,
    log_params_tags_bulk,
    terminate_bulk,
)
from raco_cli.tracking.retry import retrying

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 60.0
# an unbuffered run's evaluations reach the store at most this often (and when it ends): one
# write per evaluation was ~11 ms, 85 of them a tenth of the main job, for a live view that
# gains nothing from a finer grain
LIVE_EVERY_S = 5.0
# a RUNNING run of another host is stale after this long without a heartbeat
STALE_AFTER_S = float(os.environ.get("RACO_STALE_AFTER_S", "900"))
PARENT_FILE = ".mlflow_parent_run_id"
# liveness of RUNNING runs, outside the records: <store dir>/.raco-locks/<run_id>.lock (RunLock)
LOCK_DIR = ".raco-locks"
# a run without process timing (tag "raco.timed" = "false": a private scope=model run) carries
# no start/end time of its own: both are this public value (the UTC day it was created)
UNTIMED_TAG = "raco.timed"
DAY_MS = 86_400_000
# scalar metrics mirrored to MLflow at every evaluation, per split
EVAL_METRICS = (
    "accuracy", "loss", "constraint_max_hard", "constraint_max_soft", "violation_hard",
    "violation_soft", "dp_gap", "eo_gap", "eop_gap", "fnr", "fpr", "mspe", "worst_group_mspe",
    "worst_group_accuracy", "worst_class_accuracy", "roc_auc", "f1", "grad_norm", "dro_objective",
    "auc_loss", "auc_confidence",
)  # fmt: skip


def artifact_root_for(uri: str) -> str | None:
    """Artifacts of a SQLite store live beside the database (``<db dir>/mlartifacts``)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        return str((db.parent / "mlartifacts").resolve())
    return None


def prepare_store(uri: str) -> None:
    """Create the directory of a SQLite store; fail with one line when it is not writable."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(f"Cannot create the MLflow store directory {db.parent}: {exc.strerror}. Set tracking.uri to a writable location.") from None
        if not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
            raise TrackingError(f"The MLflow store {db} is not writable. Set tracking.uri to a writable location, e.g. tracking.uri=sqlite:///$HOME/raco.db")


def client(uri: str):
    """An MlflowClient whose store exists and is migrated.

    A new SQLite store is created and migrated on first use; parallel jobs racing to do
    that corrupt the migration ("Online migration expected to match one row"), so the
    first use happens under an exclusive file lock beside the database.
    """
    from mlflow.tracking import MlflowClient

    for name in ("mlflow", "alembic"):  # schema-migration chatter on a new store
        logging.getLogger(name).setLevel(logging.WARNING)
    prepare_store(uri)
    if not uri.startswith("sqlite:///"):
        return retrying(MlflowClient, tracking_uri=uri)
    with file_lock(Path(uri[len("sqlite:///") :] + ".lock")):
        c = retrying(MlflowClient, tracking_uri=uri)
        retrying(c.search_experiments, max_results=1)
    return c


def experiment_id(c, name: str, uri: str) -> str:
    """Id of an experiment, created on first use (safe when parallel jobs race to create it)."""
    exp = retrying(c.get_experiment_by_name, name)
    if exp is not None:
        return exp.experiment_id
    root = artifact_root_for(uri)
    try:
        return retrying(c.create_experiment, name, artifact_location=f"{root}/{name}" if root else None)
    except Exception:  # noqa: BLE001 - another job created it first
        exp = retrying(c.get_experiment_by_name, name)
        if exp is None:
            raise
        return exp.experiment_id


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created) between processes of one host or a shared disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sweep_parent(c, exp_id: str, sweep_dir: Path, *, name: str, tags: Mapping[str, str], start_time: int | None = None,
                 lock: tuple[Path, Mapping[str, str]] | None = None) -> str:
    """The parent run grouping one multirun's jobs (created once, by whichever job is first).

    ``start_time``: its start (None: now); ``lock``: ``(lock dir, identity of the sweep's
    process)``, written as the parent's :class:`RunLock` (not held: that process is the sweep's)."""
    marker = Path(sweep_dir) / PARENT_FILE
    with file_lock(Path(sweep_dir) / ".mlflow_parent.lock"):
        if marker.exists() and marker.read_text().strip():
            return marker.read_text().strip()
        run = retrying(c.create_run, exp_id, run_name=name, tags={**tags, "raco.sweep_dir": str(sweep_dir), "raco.role": "sweep"},
                       **({} if start_time is None else {"start_time": start_time}))
        if lock is not None:
            RunLock(Path(lock[0]) / f"{run.info.run_id}.lock", lock[1], hold=False)
        marker.write_text(run.info.run_id)
        return run.info.run_id


_PARAM_NAME = re.compile(r"[^\w\-. :/]")  # what MLflow accepts in param/metric names


@functools.lru_cache(maxsize=4096)
def _metric_name(key: str) -> str:
    """A metric name MLflow accepts: names built from data names (a group "F&M", a class
    ">50K") get "_" for the characters MLflow refuses (a run logs the same few names at
    every evaluation: cached)."""
    return _PARAM_NAME.sub("_", key)


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> ``{"a.b.c": "value"}`` (MLflow params are flat strings).

    Characters MLflow refuses in a name (e.g. the column ``Jitter(%)`` of a dataset's
    ``bounds``) become ``_``:

    >>> flatten({"dataset": {"bounds": {"Jitter(%)": [0, 1]}}})
    {'dataset.bounds.Jitter___': '[0, 1]'}
    """
    out: dict[str, str] = {}
    for key, value in cfg.items():
        name = f"{prefix}{_PARAM_NAME.sub('_', str(key))}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)[:6000]
    return out


def _process_start(pid: int) -> str | None:
    """Start time of a process in clock ticks since boot (/proc/<pid>/stat field 22), or
    None when the process does not exist.  Pid + start time identify a process even when
    the pid is reused later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # a zombie (killed, not yet reaped) or dead process is gone
        return None
    return fields[19]


def process_identity() -> dict[str, str]:
    """Tags identifying the current process, for stale-run detection (full records only: a run
    under ``privacy.scope=model`` keeps them in its :class:`RunLock`, never in a record)."""
    pid = os.getpid()
    return {
        "raco.host": socket.gethostname(),
        "raco.pid": str(pid),
        "raco.pid_start": str(_process_start(pid) or ""),
        "raco.heartbeat": str(int(time.time())),
    }


def public_day_ms(now: float | None = None) -> int:
    """The start and end time (ms) of a run without process timing: the UTC day, at midnight."""
    return int((time.time() if now is None else now) * 1000) // DAY_MS * DAY_MS


def lock_dir(uri: str) -> Path:
    """Where the run locks of a store live: ``.raco-locks`` beside a SQLite database (outside
    its artifacts and every run directory), else under ``RACO_LOCK_DIR`` (default ``outputs``)."""
    if os.environ.get("RACO_LOCK_DIR"):
        return Path(os.environ["RACO_LOCK_DIR"]) / LOCK_DIR
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).parent / LOCK_DIR
    return Path("outputs") / LOCK_DIR


class RunLock:
    """A RUNNING run's liveness, outside the records: ``<lock dir>/<run_id>.lock`` holds the
    process's host, pid and start time (JSON), its mtime is the heartbeat, and the live process
    holds an exclusive ``flock`` on it.  Removed when the run ends (nothing of it outlives the
    run); a killed run's is removed by whoever marks the run stale (:func:`lock_verdict`).

    ``hold=False``: the file names a process that is not this one (a sweep's parent run belongs
    to the process that launched the sweep: :func:`sweep_process_identity`), no lock held.
    """

    def __init__(self, path: Path, identity: Mapping[str, str], *, hold: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: Any = open(self.path, "a+")
        if hold:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new run id: nobody else has it
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(json.dumps({"host": identity.get("raco.host"), "pid": identity.get("raco.pid"),
                                   "pid_start": identity.get("raco.pid_start")}))
        self._fh.flush()
        if not hold:
            self._fh.close()
            self._fh = None

    def beat(self) -> None:
        """Refresh the heartbeat (the file's mtime)."""
        try:
            os.utime(self.path)
        except OSError:  # removed by a process that judged the run stale: nothing to refresh
            pass

    def release(self) -> None:
        """Remove the file, then drop the lock (a checker that opened it first sees it gone)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def lock_verdict(path: Path, *, now: float | None = None, stale_after_s: float = STALE_AFTER_S) -> str | None | bool:
    """Why the run of the lock at ``path`` is stale, None when it may be alive, False when there
    is no lock (a run that ended, or one recorded before locks: its tags tell).

    * Same host: the lock is held (alive); else alive only while the recorded pid and process
      start still exist (a sweep parent's process holds no lock).  Exact.
    * Another host (a shared disk): no heartbeat (mtime) for ``stale_after_s`` seconds.
    """
    now = time.time() if now is None else now
    try:
        fh = open(path)
    except OSError:
        return False
    with fh:
        try:
            ident = json.loads(fh.read() or "{}")
        except ValueError:
            ident = {}
        host, pid, start = ident.get("host"), str(ident.get("pid") or ""), ident.get("pid_start")
        if host == socket.gethostname():
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return None  # held: the run's process lives
            fcntl.flock(fh, fcntl.LOCK_UN)
            try:
                if os.stat(path).st_ino != os.fstat(fh.fileno()).st_ino:
                    return False
            except OSError:
                return False  # removed meanwhile: the run ended
            if pid.isdigit() and start and _process_start(int(pid)) == start:
                return None
            return f"process {pid or '?'} on {host} is gone (killed or crashed)"
        age = now - os.fstat(fh.fileno()).st_mtime
    if age > stale_after_s:
        return f"no heartbeat from {host or 'an unknown host'} for more than {int(stale_after_s)} s"
    return None


# "host pid start" of the process that launched a sweep, exported to its jobs by launchers
# whose jobs are separate processes (cli/slurm.py): the sweep's parent run carries it, so the
# parent is not stale while the sweep waits for its jobs, even once the job that created it ended
SWEEP_PROCESS_ENV = "RACO_SWEEP_PROCESS"


def sweep_process_identity() -> dict[str, str]:
    """Tags identifying the process that launched the current sweep (this process when no
    launcher exported one)."""
    identity = process_identity()
    fields = os.environ.get(SWEEP_PROCESS_ENV, "").split()
    if len(fields) == 3 and fields[1].isdigit():
        identity.update({"raco.host": fields[0], "raco.pid": fields[1], "raco.pid_start": fields[2]})
    return identity


def is_stale(tags: Mapping[str, str], *, now: float | None = None, stale_after_s: float = STALE_AFTER_S,
             lock: Path | None = None) -> str | None:
    """Why a RUNNING run is stale (its process is gone), or None when it may still be alive.

    A run with a :class:`RunLock` at ``lock`` is judged by it (:func:`lock_verdict`); without
    one, by its tags (runs of full records, and runs recorded before locks):

    * Same host: the process with the recorded pid and start time no longer exists
      (SIGKILL, OOM kill, power loss of the job, ...).  Exact.
    * Another host, or no process tags: no heartbeat for ``stale_after_s`` seconds
      (``RACO_STALE_AFTER_S``, default 900; heartbeats are written every minute).
    """
    if lock is not None:
        verdict = lock_verdict(lock, now=now, stale_after_s=stale_after_s)
        if verdict is not False:
            return verdict  # type: ignore[return-value]
    now = time.time() if now is None else now
    host, pid = tags.get("raco.host"), tags.get("raco.pid")
    if host == socket.gethostname() and pid and pid.isdigit():
        start = _process_start(int(pid))
        if start is None or (tags.get("raco.pid_start") and start != tags.get("raco.pid_start")):
            return f"process {pid} on {host} is gone (killed or crashed)"
        return None
    beat = tags.get("raco.heartbeat")
    if beat is not None and beat.isdigit() and now - int(beat) > stale_after_s:
        return f"no heartbeat from {host or 'an unknown host'} for {int(now - int(beat))} s"
    return None


def _end_time(run: Any) -> dict[str, int]:
    """``set_terminated``'s end time for a run another process ends: its (public) start time
    when it carries no process timing, else none given (now)."""
    return {"end_time": run.info.start_time} if run.data.tags.get(UNTIMED_TAG) == "false" else {}


def mark_stale_runs(c, exp_id: str, *, dry_run: bool = False, locks: Path | None = None) -> list[tuple[str, str]]:
    """Mark RUNNING runs whose process is gone as FAILED (tag ``raco.stale_reason``).

    Called before every new run, so a killed run never stays RUNNING once anything else runs;
    ``raco runs stale`` calls it on demand.  Sweep parents are closed when no child is
    RUNNING any more and the process that created them is gone.

    ``locks``: the store's lock directory (:func:`lock_dir`; default: the client's store's).

    Returns:
        ``(run_id, reason)`` of every run marked (or that would be, with ``dry_run``).
    """
    if locks is None:
        uri = getattr(c, "tracking_uri", None) or getattr(getattr(c, "_tracking_client", None), "tracking_uri", None)
        locks = lock_dir(str(uri or ""))
    running = retrying(c.search_runs, [exp_id], filter_string="attributes.status = 'RUNNING'", max_results=5000)
    by_id = {run.info.run_id: run for run in running}

    def lock(run: Any) -> Path:
        return Path(locks) / f"{run.info.run_id}.lock"

    marked: list[tuple[str, str]] = []
    parents = []
    for run in running:
        tags = run.data.tags
        if tags.get("raco.role") == "sweep":
            parents.append(run)
            continue
        reason = is_stale(tags, lock=lock(run))
        if reason is not None:
            marked.append((run.info.run_id, reason))
    still_running_parents = {
        r.data.tags.get("mlflow.parentRunId") for r in running if r.info.run_id not in {m[0] for m in marked}
    }
    for run in parents:
        reason = is_stale(run.data.tags, lock=lock(run))
        if reason is not None and run.info.run_id not in still_running_parents:
            marked.append((run.info.run_id, f"sweep parent: {reason}, no child running"))
    if not dry_run:
        for run_id, reason in marked:
            log.warning("Marking stale MLflow run %s as FAILED: %s", run_id, reason)
            try:
                retrying(c.set_tag, run_id, "raco.stale_reason", reason)
                retrying(c.set_terminated, run_id, status="FAILED", **_end_time(by_id[run_id]))
                with contextlib.suppress(OSError):
                    (Path(locks) / f"{run_id}.lock").unlink()
            except Exception as exc:  # noqa: BLE001 - housekeeping of another run must not fail this one
                # The jobs of a sweep start together and each sweeps the store: two of them may mark the
                # same stale run at once, and the second tag insert violates the store's unique key
                # (measured: a 102-run group of fig9_low_eps lost this way).  Whoever wins, the run ends FAILED.
                if _marked_by_another(c, run_id):
                    log.info("Stale MLflow run %s was marked by another process", run_id)
                else:
                    log.warning("Could not mark stale MLflow run %s (%s); `raco runs stale` retries", run_id, exc)
    return marked


def _marked_by_another(c, run_id: str) -> bool:
    """Whether a stale run already carries the mark (its status left RUNNING or its tag is set)."""
    try:
        run = retrying(c.get_run, run_id)
    except Exception:  # noqa: BLE001
        return False
    return run.info.status != "RUNNING" or "raco.stale_reason" in run.data.tags


def close_sweep(uri: str, sweep_dir: Path) -> None:
    """End a multirun's parent run: FINISHED, or FAILED when a child did not finish."""
    marker = Path(sweep_dir) / PARENT_FILE
    if not marker.exists():
        return
    parent = marker.read_text().strip()
    if uri.startswith("sqlite:///") and _by_sql(uri, "end_parent_run", parent) is not None:
        _drop_lock(uri, parent)
        return
    c = client(uri)
    run = retrying(c.get_run, parent)
    children = retrying(
        c.search_runs, [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'", max_results=5000
    )
    ok = all(r.info.status == "FINISHED" for r in children)
    retrying(c.set_terminated, parent, status="FINISHED" if ok else "FAILED", **_end_time(run))
    _drop_lock(uri, parent)


def _drop_lock(uri: str, run_id: str) -> None:
    """Remove a run's :class:`RunLock` file (the run ended; nothing of its liveness stays)."""
    with contextlib.suppress(OSError):
        (lock_dir(uri) / f"{run_id}.lock").unlink()


def fail_run(uri: str, run_id: str, error: str) -> str:
    """Mark a RUNNING run whose process is gone (e.g. a SLURM task cancelled or killed) FAILED,
    with the reason in ``raco.error``; a run that already ended keeps its status.  The run's
    status afterwards."""
    c = client(uri)
    run = retrying(c.get_run, run_id)
    status = str(run.info.status)
    if status != "RUNNING":
        return status
    retrying(c.set_tag, run_id, "raco.error", error[:5000])
    retrying(c.set_terminated, run_id, status="FAILED", **_end_time(run))
    _drop_lock(uri, run_id)
    return "FAILED"


_STALE_CHECKED: set[str] = set()
# (uri, experiment name) -> id, for recorders sharing a client (a group's runs): one lookup per
# group instead of one per run (a fifth of opening a run)
_EXPERIMENT_IDS: dict[tuple[str, str], str] = {}
_client = client


class RunRecorder:
    """One MLflow run; also the :class:`Reporter` a method reports evaluations to.

    ``client``: an MlflowClient to share (the runs of a sweep group: one connection, one
    stale-run check); ``buffered``: metrics are kept and logged in bulk when the run ends,
    or by :func:`flush_recorders` for a whole group (a group's runs evaluate together, and a
    store write per run per evaluation would cost more than the training).
    ``timed``: metrics carry the clock time they were logged at; ``False`` (a private run
    under ``privacy.scope=model``): no record carries process timing (docs/privacy.md,
    "Timing"): every metric, the run's start and its end carry one public value (the UTC day of
    its creation: :func:`public_day_ms`), so the store times neither the run nor its evaluation
    windows (step times follow the private batch sizes, a search's length its secret K); no
    process tags (pid start, heartbeat): the run's liveness is its :class:`RunLock` only.
    ``create=False`` (buffered only): the MLflow run is made later, with the rest of its group,
    by :func:`create_runs`; ``run_id`` is empty until then.
    """

    def __init__(
        self,
        *,
        uri: str,
        experiment: str,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        parent_sweep_dir: Path | None = None,
        client: Any = None,
        buffered: bool = False,
        timed: bool = True,
        create: bool = True,
    ) -> None:
        from mlflow.entities import Param, RunTag

        if not (create or buffered):
            raise ValueError("a recorder whose run is created later must be buffered")
        shared = client is not None
        self.client = client if shared else _client(uri)
        known = _EXPERIMENT_IDS.get((uri, experiment)) if shared else None
        self.experiment_id = known or experiment_id(self.client, experiment, uri)
        if shared:
            _EXPERIMENT_IDS[(uri, experiment)] = self.experiment_id
        if not shared or self.experiment_id not in _STALE_CHECKED:  # a group's runs share one client and one check
            mark_stale_runs(self.client, self.experiment_id, locks=lock_dir(uri))
            if shared:
                _STALE_CHECKED.add(self.experiment_id)
        self.buffered = buffered
        self.timed = timed
        self._fixed_ts = None if timed else public_day_ms()
        self._pending: list[Any] = []
        self._written = -math.inf  # (unbuffered) monotonic time of the last evaluation write
        tags = {**dict(tags), **(process_identity() if timed else {UNTIMED_TAG: "false"})}
        self._last_beat = time.time()
        self._locks = lock_dir(uri)
        self._lock: RunLock | None = None
        if parent_sweep_dir is not None:
            parent = sweep_parent(
                self.client, self.experiment_id, parent_sweep_dir, name=f"sweep-{Path(parent_sweep_dir).name}",
                tags=sweep_process_identity() if timed else {UNTIMED_TAG: "false"}, start_time=self._fixed_ts,
                lock=(self._locks, sweep_process_identity()),
            )
            tags["mlflow.parentRunId"] = parent
        self._new_run = (run_name, tags)
        self.run_id, self.artifact_uri = "", ""  # artifact_uri: where the run's artifacts go, when known
        if create:
            fixed = {} if self._fixed_ts is None else {"start_time": self._fixed_ts}
            info = retrying(self.client.create_run, self.experiment_id, run_name=run_name, tags=tags, **fixed).info
            self.run_id, self.artifact_uri = info.run_id, info.artifact_uri
            self._hold_lock()
        self._artifacts: Any = None  # the run's local artifact repository, made on first use
        self.uri = uri
        self._RunTag = RunTag
        # buffered (a group's runs): params and later tags wait for flush_recorders, which
        # writes every run's in one transaction (the group flushes params before training)
        self._pending_params = [Param(k, v) for k, v in flatten(params).items()]
        self._pending_tags: list[Any] = []
        if not buffered:
            self.flush()

    def _hold_lock(self) -> None:
        """Take the run's :class:`RunLock` (once its run id is known)."""
        self._lock = RunLock(self._locks / f"{self.run_id}.lock", process_identity())

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # Reporter protocol
    def on_step(self, step: int, total: int, values: Mapping[str, float]) -> None:
        now = time.time()
        if now - self._last_beat >= HEARTBEAT_EVERY_S:
            self.heartbeat(now)

    def heartbeat(self, now: float | None = None) -> None:
        """Refresh the run's lock (a run on another host is stale without heartbeats), and its
        ``raco.heartbeat`` tag in full records (a run without process timing has none)."""
        self._last_beat = time.time() if now is None else now
        if self._lock is not None:
            self._lock.beat()
        if self.timed:
            retrying(self.client.set_tag, self.run_id, "raco.heartbeat", str(int(self._last_beat)))

    def on_eval(self, record: EvalRecord) -> None:
        metrics = {}
        for split, m in record.metrics.items():
            for name in EVAL_METRICS:
                v = m.get(name)
                if isinstance(v, (int, float)) and v == v:  # skip NaN
                    metrics[f"{split}/{name}"] = float(v)
            if m.get("satisfied") is not None:  # scope=model: None when no noisy histogram tells
                metrics[f"{split}/satisfied"] = float(bool(m["satisfied"]))
            if isinstance(m.get("noisy_violation"), float):  # scope=model: from the noisy histograms
                metrics[f"{split}/noisy_violation"] = m["noisy_violation"]
        if record.lam:
            metrics["dual/lambda_max"] = max(record.lam)
        self._pending.extend(self._rows(metrics, record.step))
        if self.buffered:
            return
        # unbuffered: kept with their own timestamps, then written together every LIVE_EVERY_S
        # (the first at once; the rest by :meth:`finish`): the same rows as one write each
        now = time.monotonic()
        if now - self._written >= LIVE_EVERY_S:
            self._written = now
            self.flush()

    def flush(self) -> None:
        """Log the buffered params, tags and metrics (:func:`flush_recorders` does it for many
        runs at once)."""
        flush_recorders([self])

    def log_metrics(self, metrics: Mapping[str, float], *, step: int = 0) -> None:
        """Log now (with the evaluations :meth:`on_eval` kept, first: the store sees the metrics
        in order), or keep for :meth:`flush` when the recorder is ``buffered``."""
        self._pending.extend(self._rows(metrics, step))  # plain rows: a group buffers ~500 000 of them
        if not self.buffered:
            self.flush()

    def _rows(self, metrics: Mapping[str, float], step: int) -> list[tuple[str, float, int, int]]:
        """Plain ``(key, value, timestamp, step)`` rows, timestamped now (or at the run's creation)."""
        ts = self._fixed_ts if self._fixed_ts is not None else int(time.time() * 1000)
        return [(_metric_name(k), float(v), ts, step) for k, v in metrics.items()]

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set now, or keep for :meth:`flush` when the recorder is ``buffered``."""
        batch = [self._RunTag(k, str(v)) for k, v in tags.items()]
        if self.buffered:
            self._pending_tags.extend(batch)
            return
        retrying(self.client.log_batch, self.run_id, tags=batch)

    def log_artifact(self, path: Path) -> None:
        """``client.log_artifact(run_id, path)``.  When the run's artifacts are local files
        (the embedded store's ``mlartifacts``), the file goes into its repository directly:
        MLflow's call first loads the whole run (params, tags, latest metrics) to learn that
        location, ~6 ms a run, two artifacts a run, which a group knows from creating it."""
        if self._artifacts is None and self.artifact_uri and urllib.parse.urlparse(self.artifact_uri).scheme in ("", "file"):
            from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

            self._artifacts = LocalArtifactRepository(self.artifact_uri)
        if self._artifacts is not None and Path(path).is_file():
            retrying(self._artifacts.log_artifact, str(path))
        else:
            retrying(self.client.log_artifact, self.run_id, str(path))

    def log_model(self, local_dir: Path, *, name: str = "model", step: int = 0) -> str:
        """Log an MLflow model directory as a logged model of this run (MLflow 3: what
        ``mlflow.pyfunc.log_model`` does, through this run's client instead of the global
        fluent state).  Returns its URI, ``models:/<model_id>``."""
        from mlflow.entities import LoggedModelOutput

        model = retrying(self.client.create_logged_model, self.experiment_id, name=name, source_run_id=self.run_id)
        retrying(self.client.log_outputs, self.run_id, [LoggedModelOutput(model.model_id, step=step)])
        retrying(self.client.log_model_artifacts, model.model_id, str(local_dir))
        retrying(self.client.finalize_logged_model, model.model_id, "READY")
        if self._fixed_ts is not None:  # no process timing: the model's times are the run's public one
            from raco_cli.tracking.bulk_metrics import untime_logged_model

            untime_logged_model(self.client, model.model_id, self._fixed_ts)
        return f"models:/{model.model_id}"

    def finish(self, status: str) -> None:
        """Log what is buffered and mark the run FINISHED, FAILED or KILLED."""
        finish_recorders([self], status)


def create_runs(recorders: Sequence[RunRecorder | None]) -> None:
    """Create the MLflow runs of the recorders opened with ``create=False``, in one store
    transaction per shared client and experiment (:func:`raco_cli.tracking.bulk_metrics.create_runs_bulk`)."""
    for recs in _by_store(recorders, lambda rec: not rec.run_id, by_experiment=True):
        made = create_runs_bulk(recs[0].client, recs[0].experiment_id, [rec._new_run for rec in recs],
                                start_times=[rec._fixed_ts for rec in recs])
        for rec, (run_id, artifact_uri) in zip(recs, made):
            rec.run_id, rec.artifact_uri = run_id, artifact_uri
            rec._hold_lock()


def flush_recorders(recorders: Sequence[RunRecorder | None]) -> None:
    """Log the buffered params, tags and metrics of several runs, in bulk per shared client
    (:mod:`raco_cli.tracking.bulk_metrics`); a recorder's buffers are emptied once written."""
    for recs in _by_store(recorders, lambda rec: bool(rec._pending or rec._pending_params or rec._pending_tags)):
        log_params_tags_bulk(recs[0].client, {rec.run_id: (rec._pending_params, rec._pending_tags) for rec in recs})
        for rec in recs:
            rec._pending_params, rec._pending_tags = [], []
        log_metrics_bulk(recs[0].client, {rec.run_id: rec._pending for rec in recs})
        for rec in recs:
            rec._pending = []


def finish_recorders(recorders: Sequence[RunRecorder | None], status: str) -> None:
    """Log what the recorders buffer, then mark their runs ``status`` (FINISHED, FAILED or
    KILLED), in one store transaction per shared client (the runs are ended even when the
    flush fails)."""
    try:
        flush_recorders(recorders)
    finally:
        try:
            for recs in _by_store(recorders, lambda rec: True):
                terminate_bulk(recs[0].client, [rec.run_id for rec in recs], status, end_times=[rec._fixed_ts for rec in recs])
        finally:
            for rec in recorders:
                if rec is not None:
                    rec._release_lock()


def _by_store(recorders: Sequence[RunRecorder | None], keep: Callable[[RunRecorder], bool], *,
              by_experiment: bool = False) -> list[list[RunRecorder]]:
    """The recorders ``keep`` accepts, grouped by shared client (and experiment): one bulk
    write per group, in the recorders' order."""
    groups: dict[tuple[int, str], list[RunRecorder]] = {}
    for rec in recorders:
        if rec is not None and keep(rec):
            groups.setdefault((id(rec.client), rec.experiment_id if by_experiment else ""), []).append(rec)
    return list(groups.values())


def find_runs(uri: str, experiment: str, *, filter_string: str = "") -> list[Any]:
    """All runs of an experiment matching an MLflow filter (empty list when it does not exist)."""
    c = client(uri)
    exp = retrying(c.get_experiment_by_name, experiment)
    if exp is None:
        return []
    out, token = [], None
    while True:
        page = retrying(c.search_runs, [exp.experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _by_sql(uri: str, name: str, *args: Any) -> Any:
    """``sqlite_direct.<name>(db, *args)`` on a SQLite store (no MLflow import, one query
    instead of an object per row: tracking/sqlite_direct.py); None for any other store or when
    the query fails (the caller then asks MLflow)."""
    if not uri.startswith("sqlite:///"):
        return None
    import sqlite3

    from raco_cli.tracking import sqlite_direct

    db = Path(uri[len("sqlite:///") :])
    try:
        return getattr(sqlite_direct, name)(db, *args)
    except sqlite3.Error as exc:
        log.debug("%s on %s by SQL failed (%s); asking MLflow", name, db, exc)
        return None


def finished_config_hashes(uri: str, experiment: str) -> set[str]:
    """``raco.config_hash`` tags of the FINISHED runs of an experiment (sweep resume).

    A SQLite store that does not exist yet has none (and is not created here).
    """
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        return set()
    by_sql = _by_sql(uri, "finished_config_hashes", experiment)
    if by_sql is not None:
        return by_sql  # type: ignore[no-any-return]
    runs = find_runs(uri, experiment, filter_string="attributes.status = 'FINISHED'")
    return {h for r in runs if (h := r.data.tags.get("raco.config_hash"))}


def run_records(uri: str, experiment: str) -> list[dict[str, Any]]:
    """The training runs of an experiment as plain records (figures and reports read these).

    Only runs tagged ``raco.config_hash`` (sweep parents and report runs are not training
    runs).  Each record: ``run_id``, ``status`` (FINISHED, FAILED, RUNNING, KILLED),
    ``params`` (flattened config, strings), ``metrics`` (latest values), ``tags``.
    A SQLite store that does not exist has no runs (and is not created).
    """
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        return []
    by_sql = _by_sql(uri, "run_records", experiment)
    if by_sql is not None:
        return by_sql  # type: ignore[no-any-return]
    out = []
    for r in find_runs(uri, experiment):
        if "raco.config_hash" not in r.data.tags:
            continue
        out.append(
            {
                "run_id": r.info.run_id,
                "status": r.info.status,
                "params": dict(r.data.params),
                "metrics": dict(r.data.metrics),
                "tags": dict(r.data.tags),
            }
        )
    return out


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every logged value of a run's metric, by step (empty when absent)."""
    c = client(uri)
    return sorted((int(m.step), float(m.value)) for m in retrying(c.get_metric_history, run_id, key))


def log_report_artifacts(uri: str, experiment: str, paths: list[Path], *, name: str = "figures") -> str:
    """Log figures and tables to the experiment's report run (one per experiment, tagged
    ``raco.role=report``; created on first use, artifacts replaced by later calls)."""
    c = client(uri)
    exp_id = experiment_id(c, experiment, uri)
    runs = retrying(c.search_runs, [exp_id], filter_string="tags.`raco.role` = 'report'", max_results=1)
    if runs:
        run_id = runs[0].info.run_id
    else:
        run_id = retrying(c.create_run, exp_id, run_name=name, tags={"raco.role": "report"}).info.run_id
    for path in paths:
        retrying(c.log_artifact, run_id, str(path))
    retrying(c.set_terminated, run_id, status="FINISHED")
    return run_id
