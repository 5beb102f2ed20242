"""The progress bar is a record too: in scope=model it shows no exact per-step statistic."""

from raco_cli.run.progress import Progress


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
