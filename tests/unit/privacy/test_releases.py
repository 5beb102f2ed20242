"""The release tape (raco_cli/privacy/releases.py): recorded in order, replayed in order, and a
replay must use it up exactly."""

from __future__ import annotations

import pytest

from raco_cli.privacy import releases


def test_a_tape_replays_in_order_and_checks_kinds():
    with releases.recording() as tape:
        assert releases.release("a", lambda: 1) == 1 and releases.release("b", lambda: 2) == 2
    with releases.replaying(tape):
        assert releases.release("a", lambda: 10) == 1 and releases.release("b", lambda: 20) == 2
    with pytest.raises(RuntimeError, match="out of step"), releases.replaying(tape):
        releases.release("b", lambda: 0)


def test_a_tape_left_unconsumed_is_an_error():
    """A replayed run that made fewer releases than the recorded one did not compute the same thing."""
    with releases.recording() as tape:
        releases.release("a", lambda: 1)
        releases.release("b", lambda: 2)
    with pytest.raises(RuntimeError, match="tape not consumed: 1 release"), releases.replaying(tape):
        releases.release("a", lambda: 0)


def test_an_exhausted_tape_is_an_error():
    with releases.recording() as tape:
        releases.release("a", lambda: 1)
    with pytest.raises(RuntimeError, match="exhausted"), releases.replaying(tape):
        releases.release("a", lambda: 0)
        releases.release("a", lambda: 0)
