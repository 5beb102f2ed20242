"""Train one run: prepare (if not done) -> open its MLflow run -> fit -> finish.

:func:`train` is the whole life of a run that trains alone; a sweep group
(:mod:`raco_cli.run.group`) shares the same steps, with many runs fitted at once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raco_cli.run.finish import finish_run
from raco_cli.run.prepare import PreparedRun, prepare_run
from raco_cli.run.progress import FanOut, Progress, untimed_logs
from raco_cli.run.records import open_recorder, tag_error
from raco_cli.run.spec import plain_config

log = logging.getLogger(__name__)

_SECURE_RNG_WARNED = False
_NUMPY_BLAS_LIMITED = False


def train(
    cfg: Mapping[str, Any], *, run_dir: Path, sweep_dir: Path | None = None, prepared: PreparedRun | None = None
) -> dict[str, Any]:
    """Run one training job and return its summary (also written to ``run_dir/summary.json``).

    ``cfg``: the composed config (a plain mapping or Hydra's ``DictConfig``); ``prepared``:
    the job's :func:`~raco_cli.run.prepare.prepare_run`, when the caller already made it.

    Raises:
        RacoError: bad config, missing data, an unreachable budget or an unwritable run
            directory (before any MLflow write); a failed write of the outputs (the MLflow
            run is then marked FAILED).
    """
    with untimed_logs(model_scope(cfg if prepared is None else prepared.resolved)):
        return _train(cfg, run_dir=Path(run_dir), sweep_dir=sweep_dir, prepared=prepared)


def model_scope(cfg: Mapping[str, Any]) -> bool:
    """Whether a config asks for ``privacy.scope=model`` (its logs then carry no clock time)."""
    return str((plain_config(cfg).get("privacy") or {}).get("scope", "model")) == "model"


def _train(cfg: Mapping[str, Any], *, run_dir: Path, sweep_dir: Path | None, prepared: PreparedRun | None) -> dict[str, Any]:
    t_start = time.time()
    prep = prepared if prepared is not None else prepare_run(cfg)
    spec, method, pplan = prep.spec, prep.method, prep.plan
    check_writable(run_dir)
    warn_secure_rng(bool(method.PRIVATE), spec.secure_rng)
    set_threads(spec.threads)
    recorder = open_recorder(prep, run_dir, sweep_dir)
    progress = Progress(pplan.steps, desc=f"{spec.method.name}/{spec.dataset.display}", show_values=prep.full_records)
    status = "FAILED"
    try:
        result = method.fit(
            prep.data, prep.model, prep.constraints, pplan.spec, steps=pplan.steps, seeds=prep.seeds, device=prep.device,
            reporter=FanOut(progress, recorder),
        )
        progress.close()
        summary = finish_run(prep, result, run_dir, recorder, started=t_start, curves=draw_curves(spec, sweep_dir))
        status = "FINISHED"
        return summary
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception as exc:
        tag_error(recorder, exc)
        raise
    finally:
        progress.close()
        if recorder is not None:
            recorder.finish(status)


def set_threads(threads: int | None) -> None:
    """``threads``: torch CPU threads (e.g. 1 for timing, Table 2: no thread sync on tiny ops).

    numpy's own BLAS (OpenBLAS) is kept to one thread whatever ``threads`` is: torch does the
    heavy products, and two thread pools on the same cores oversubscribe them (torch's OpenMP
    workers spin after each op while OpenBLAS's threads wait for a core).  Measured on 2 cores:
    a 160-run evaluation of Adult's three splits with torch on 2 threads, min 630-691 ms with
    OpenBLAS on 2 threads, 347-365 ms on 1 (docs/batched.md)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    single_threaded_numpy_blas()


def single_threaded_numpy_blas() -> None:
    """Limit the OpenBLAS libraries numpy and scipy have loaded to one thread (not a BLAS that
    torch links dynamically: its products are the ones worth threading).  Once per process:
    finding the libraries costs ~10 ms."""
    global _NUMPY_BLAS_LIMITED
    if _NUMPY_BLAS_LIMITED:
        return
    from threadpoolctl import ThreadpoolController

    for lib in ThreadpoolController().lib_controllers:
        if lib.internal_api == "openblas" and "torch" not in Path(lib.filepath).parts:
            lib.set_num_threads(1)
    _NUMPY_BLAS_LIMITED = True


def draw_curves(spec: Any, sweep_dir: Path | None) -> bool:
    """``tracking.curves``: true/false, or auto (single runs draw curves.png, sweep jobs do not)."""
    return spec.tracking.curves if isinstance(spec.tracking.curves, bool) else sweep_dir is None


def warn_secure_rng(private: bool, secure: bool) -> None:
    """Warn once per process that the noise is not from a secure source (as Opacus does)."""
    global _SECURE_RNG_WARNED
    if private and not secure and not _SECURE_RNG_WARNED:
        _SECURE_RNG_WARNED = True
        log.warning(
            "privacy.secure_rng=false: noise and Poisson batches come from seeded PRNGs whose seeds are "
            "recorded, so the guarantee does not hold against readers of the records (they know every "
            "batch and noise draw). Fine for reproducible experiments; for a model you release keep the "
            "default (privacy.secure_rng=auto: secret randomness under privacy.scope=model; docs/privacy.md)."
        )


def check_writable(run_dir: Path) -> None:
    """Fail early, with one line, when the run directory cannot take the run's outputs.

    Writes and removes a small probe file (catches read-only mounts, permissions, a full
    disk and a file in the way), before the MLflow store is touched.

    Raises:
        OutputError: the directory cannot be created or written.
    """
    from raco_cli.errors import OUTPUT_NOT_WRITABLE, OutputError

    probe = Path(run_dir) / ".raco_write_probe"
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 65536)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise OutputError(OUTPUT_NOT_WRITABLE.format(path=run_dir, reason=exc.strerror or exc)) from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
