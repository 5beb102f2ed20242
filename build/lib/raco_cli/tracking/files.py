"""Writing a run's files: atomically, with the mode every other file of the run gets.

``tempfile`` creates its files with mode 0600 whatever the umask; a file renamed into place
from one would be readable by its owner only, while everything else a run writes (config.yaml,
model.pt, curves.png, MLflow's artifacts) gets ``0666 & ~umask`` (0644 under the usual umask
022).  :func:`atomic_write` writes a temporary file beside the target, gives it that mode, and
renames it over the target, so a crash never leaves a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def umask() -> int:
    """The process's umask (read from /proc on Linux, else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: ``0666 & ~umask``."""
    return 0o666 & ~umask()


def atomic_write(path: Path, write: Callable[[IO[str]], object], *, suffix: str = ".tmp", newline: str | None = None) -> Path:
    """``write(fh)`` into a temporary file beside ``path``, then rename it over ``path``, with
    :func:`default_mode`.

    Raises:
        OSError: the directory is not writable, the disk is full, ...
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=suffix, newline=newline) as fh:
        try:
            write(fh)
        except BaseException:
            fh.close()
            os.unlink(fh.name)
            raise
    os.chmod(fh.name, default_mode())
    os.replace(fh.name, path)
    return path
