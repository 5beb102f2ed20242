"""What a run shows while it trains (raco_cli/run/progress.py): the progress bar is a record too
(in scope=model it shows no exact per-step statistic), each evaluation logs one line of the metrics
the run may show, and under scope=model the log files carry no clock time."""

import logging
from types import SimpleNamespace

from raco_cli.run.progress import UNTIMED, FanOut, Progress, untimed_logs


def _shown(show_values: bool) -> list:
    bar = Progress(40, "t", show_values=show_values)
    seen: list = []
    bar.bar.set_postfix = lambda values, refresh=True: seen.append(dict(values))  # type: ignore[method-assign]
    for step in range(1, 41):
        bar.on_step(step, 40, {"batch": 517.0})  # the exact Poisson batch size
    bar.close()
    return seen


def test_scope_model_progress_shows_no_batch_size():
    assert _shown(False) == []
    assert _shown(True) == [{"batch": "517"}, {"batch": "517"}]


def _record(step, **metrics):
    return SimpleNamespace(step=step, lam=[0.2, 0.7], metrics=metrics)


def test_each_evaluation_logs_one_line_of_what_the_run_may_show(caplog):
    bar = Progress(40, "t")
    with caplog.at_level(logging.INFO, logger="raco_cli.run.progress"):
        bar.on_eval(_record(20, val={"accuracy": 0.81234}, train={"violation_hard": -0.0123}, test={"accuracy": 0.8}))
        bar.on_eval(_record(40, test={"accuracy": 0.8}, release={"noisy_violation": 0.0042}))  # scope=model
        bar.on_eval(_record(40, test={"accuracy": 0.8}, release={}))  # no noisy histogram (unconstrained)
        bar.on_eval(_record(40, test={"mspe": 1.5}))  # task=regression, scope=model
    bar.close()
    assert [r.getMessage() for r in caplog.records] == [
        "step 20 val_acc=0.8123 train_violation=-0.0123 lam_max=0.700",
        "step 40 test_acc=0.8000 noisy_violation=0.0042 lam_max=0.700",
        "step 40 test_acc=0.8000 noisy_violation=n/a lam_max=0.700",
        "step 40 test_mspe=1.5000",
    ]


def test_fan_out_hands_every_report_to_each_listener_in_order():
    calls = []

    class Listener:
        def __init__(self, name):
            self.name = name

        def on_step(self, step, total, values):
            calls.append((self.name, "step", step, total, dict(values)))

        def on_eval(self, record):
            calls.append((self.name, "eval", record))

    fan = FanOut(Listener("bar"), None, Listener("mlflow"))  # None: tracking off
    fan.on_step(3, 10, {"batch": 5.0})
    fan.on_eval("rec")
    assert calls == [("bar", "step", 3, 10, {"batch": 5.0}), ("mlflow", "step", 3, 10, {"batch": 5.0}),
                     ("bar", "eval", "rec"), ("mlflow", "eval", "rec")]


HYDRA_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job log (hydra/job_logging/default)


def test_untimed_logs_drop_the_clock_from_log_files_while_active(tmp_path):
    handler = logging.FileHandler(tmp_path / "job.log")
    original = logging.Formatter(HYDRA_FORMAT)
    handler.setFormatter(original)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with untimed_logs(False):
            assert handler.formatter is original
        with untimed_logs():
            assert handler.formatter is not None and handler.formatter._fmt == "[%(name)s][%(levelname)s] - %(message)s"
        assert handler.formatter is original  # restored
    finally:
        root.removeHandler(handler)
        handler.close()
    assert UNTIMED.sub("", "%(asctime)s %(relativeCreated)6d %(msecs)03d: %(message)s").strip() == "%(message)s"
    assert UNTIMED.sub("", "%(created)f,%(levelname)s %(message)s") == "%(levelname)s %(message)s"
