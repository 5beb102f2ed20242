"""The release layer: every noisy release of a run passes through :func:`release`.

A release is a value computed from private records plus noise (a noisy histogram, a noisy
gradient sum, a noisy selection score).  Routing them through one function lets a
:class:`Tape` record them and replay them in place of the mechanisms.  The replay test uses it
to prove that everything ``privacy.scope=model`` writes is post-processing of the accounted
releases: a run on changed training/validation rows, fed the first run's tape, must write
the same model and records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

_ACTIVE: ContextVar[Tape | None] = ContextVar("raco_release_tape", default=None)


def _copy(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    clone = getattr(value, "clone", None)
    if callable(clone):  # torch tensors
        return clone()
    copy = getattr(value, "copy", None)
    return copy() if callable(copy) else value


class Tape:
    """The sequence of ``(kind, value)`` releases of a run; records, or replays in order."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any]] = []
        self.replaying = False
        self._position = 0

    def release(self, kind: str, compute: Callable[[], T]) -> T:
        if not self.replaying:
            value = compute()
            self.entries.append((kind, _copy(value)))
            return value
        if self._position >= len(self.entries):
            raise RuntimeError(f"tape exhausted at release {self._position} ({kind})")
        recorded_kind, value = self.entries[self._position]
        if recorded_kind != kind:
            raise RuntimeError(f"tape out of step at release {self._position}: recorded {recorded_kind}, asked {kind}")
        self._position += 1
        return _copy(value)

    def kinds(self) -> dict[str, int]:
        """Number of releases by kind."""
        out: dict[str, int] = {}
        for kind, _ in self.entries:
            out[kind] = out.get(kind, 0) + 1
        return out


def release(kind: str, compute: Callable[[], T]) -> T:
    """``compute()`` (the noisy release), recorded or replayed when a tape is active."""
    tape = _ACTIVE.get()
    return compute() if tape is None else tape.release(kind, compute)


@contextmanager
def recording() -> Iterator[Tape]:
    """Record every release made inside the block."""
    tape = Tape()
    token = _ACTIVE.set(tape)
    try:
        yield tape
    finally:
        _ACTIVE.reset(token)


@contextmanager
def replaying(tape: Tape) -> Iterator[Tape]:
    """Replay ``tape``'s releases, in order, in place of the mechanisms inside the block.

    Raises:
        RuntimeError: the block ended with releases left on the tape (the replayed run made
            fewer releases than the recorded one: it cannot have computed the same thing).
    """
    replay = Tape()
    replay.entries, replay.replaying = tape.entries, True
    token = _ACTIVE.set(replay)
    try:
        yield replay
    finally:
        _ACTIVE.reset(token)
    if replay._position != len(replay.entries):
        left = replay.entries[replay._position][0]
        raise RuntimeError(f"tape not consumed: {len(replay.entries) - replay._position} release(s) left, the next a {left}")
