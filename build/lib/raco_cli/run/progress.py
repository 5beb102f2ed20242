"""What a run shows while it trains: the progress bar and the evaluation log lines.

A method reports through ``on_step`` / ``on_eval`` (:class:`raco_cli.methods.base.Reporter`);
:class:`FanOut` hands each report to several listeners (the bar and the MLflow recorder).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


class Progress:
    """tqdm progress bar on stderr (disabled when stderr is not a terminal).

    ``show_values``: the per-step values a method reports (e.g. the Poisson batch size, an
    exact statistic of the sample) are shown only when the run writes full records.
    """

    def __init__(self, total: int, desc: str, *, show_values: bool = True) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="step", leave=False, disable=None, file=sys.stderr)
        self.show_values = show_values

    def on_step(self, step: int, total: int, values: Mapping[str, float]) -> None:
        self.bar.update(1)
        if self.show_values and step % 20 == 0:
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in values.items()}, refresh=False)

    def on_eval(self, record: Any) -> None:
        lam_max = max(record.lam) if record.lam else 0.0
        if "mspe" in record.metrics["test"]:  # task=regression: test MSPE (val in full records)
            shown_val = f" val_mspe={record.metrics['val']['mspe']:.4f}" if "val" in record.metrics else ""
            self.bar.set_postfix({"test_mspe": f"{record.metrics['test']['mspe']:.4f}"}, refresh=False)
            log.info("step %d test_mspe=%.4f%s", record.step, record.metrics["test"]["mspe"], shown_val)
            return
        if "val" not in record.metrics:  # scope=model: held-out test metrics and releases only
            noisy = record.metrics.get("release", {}).get("noisy_violation")
            shown = "n/a" if noisy is None else f"{noisy:.4f}"
            self.bar.set_postfix({"test_acc": f"{record.metrics['test']['accuracy']:.4f}", "noisy_viol": shown}, refresh=False)
            log.info("step %d test_acc=%.4f noisy_violation=%s lam_max=%.3f", record.step, record.metrics["test"]["accuracy"], shown, lam_max)
            return
        val = record.metrics["val"]
        self.bar.set_postfix({"val_acc": f"{val['accuracy']:.4f}", "viol": f"{record.metrics['train']['violation_hard']:.3f}"}, refresh=False)
        log.info(
            "step %d val_acc=%.4f train_violation=%.4f lam_max=%.3f",
            record.step, val["accuracy"], record.metrics["train"]["violation_hard"], lam_max,
        )

    def close(self) -> None:
        self.bar.close()


class FanOut:
    """One reporter that hands every report to each of ``reporters`` (None ones are skipped)."""

    def __init__(self, *reporters: Any) -> None:
        self.reporters = [r for r in reporters if r is not None]

    def on_step(self, step: int, total: int, values: Mapping[str, float]) -> None:
        for r in self.reporters:
            r.on_step(step, total, values)

    def on_eval(self, record: Any) -> None:
        for r in self.reporters:
            r.on_eval(record)


@contextmanager
def untimed_logs(active: bool = True) -> Iterator[None]:
    """While active, the log files (the root logger's file handlers: Hydra's ``<job>.log``)
    write no clock time: a private run under ``privacy.scope=model`` logs a line per evaluation,
    and their times would time each window (step times follow the private batch sizes)."""
    if not active:
        yield
        return
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler) and h.formatter is not None]
    saved = [h.formatter for h in handlers]
    for h in handlers:
        fmt = getattr(h.formatter, "_fmt", None) or "%(message)s"
        h.setFormatter(logging.Formatter(UNTIMED.sub("", fmt).strip() or "%(message)s"))
    try:
        yield
    finally:
        for h, f in zip(handlers, saved):
            h.setFormatter(f)


# %(asctime)s, %(created)f, %(msecs)d, %(relativeCreated)d and the brackets or separator around them
UNTIMED = re.compile(r"\[?%\((asctime|created|msecs|relativeCreated)\)[-#0 +]*\d*(\.\d+)?[sdf]\]?[ ,:-]*")
