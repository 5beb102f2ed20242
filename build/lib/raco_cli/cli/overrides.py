"""The arguments of ``raco train`` (and of the commands that compose like it) read before Hydra:
which are job overrides, which are flags, which directories ``--config-dir`` adds, and the
``constraint=a+b`` shorthand Hydra cannot parse."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from raco_cli.errors import ConfigError

HYDRA_PREFIXES = ("hydra.", "hydra/", "+hydra", "~hydra", "++hydra")


def expand_shorthands(args: Sequence[str]) -> list[str]:
    """Rewrite ``constraint=dp+fnr`` into ``constraint=combo constraint.parts=dp+fnr``.

    Hydra picks a group option by file name, so a combination of families is the ``combo``
    option with its ``parts`` listed; the shorthand is expanded before Hydra sees argv.  A
    sweep over options of which one is a combination (``constraint=dp,dp+fnr``) becomes a
    sweep over ``constraint.parts`` (a combination of one part is that family).  The
    ``constraint.parts`` override goes first, so later ``constraint.families.*`` overrides
    apply on top of it.

    >>> expand_shorthands(["eps=1", "constraint=dp+fnr", "constraint.families.fnr.gamma=0.2"])
    ['constraint.parts=dp+fnr', 'eps=1', 'constraint=combo', 'constraint.families.fnr.gamma=0.2']
    >>> expand_shorthands(["constraint=eo"])
    ['constraint=eo']
    """
    out: list[str] = []
    parts: list[str] = []
    for arg in args:
        if arg.startswith("constraint=") and "+" in arg:
            value = arg.split("=", 1)[1]
            if any(ch in value for ch in "()[]{}"):
                raise ConfigError(
                    f"Cannot expand {arg}: write constraint=combo constraint.parts=<a+b> (a '+'-separated list of families)."
                )
            out.append("constraint=combo")
            parts.append(f"constraint.parts={value}")
        else:
            out.append(arg)
    return parts + out


def is_hydra_override(arg: str) -> bool:
    return arg.startswith(HYDRA_PREFIXES)


def without_flag_values(args: Sequence[str]) -> list[str]:
    """Drop the values of flags that take one (``--config-dir <dir>``, ``-cd <dir>``, ``--config-name <n>``)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp"):
            skip = True
            continue
        out.append(arg)
    return out


def job_overrides(args: Sequence[str]) -> list[str]:
    """The overrides that shape the job config (no flags, no hydra.* settings)."""
    return [a for a in args if not a.startswith("-") and not is_hydra_override(a)]


def config_dirs(args: Sequence[str]) -> tuple[Path, ...]:
    """Extra config directories given with Hydra's ``--config-dir``/``-cd`` flag.

    A user keeps their own options there, e.g. ``<dir>/constraint/mine.yaml`` with
    ``name: custom`` for ``raco train --config-dir <dir> constraint=mine``.

    >>> config_dirs(["--config-dir", "/usr", "-cd=/tmp", "eps=1"])
    (PosixPath('/usr'), PosixPath('/tmp'))
    """
    out: list[Path] = []
    it = iter(args)
    for arg in it:
        for flag in ("--config-dir", "-cd"):
            if arg == flag:
                value = next(it, None)
                if value is None:
                    raise ConfigError(f"{flag} needs a directory (raco train --config-dir <dir> group=option).")
                out.append(Path(value))
            elif arg.startswith(flag + "="):
                out.append(Path(arg.split("=", 1)[1]))
    for d in out:
        if not d.is_dir():
            raise ConfigError(f"--config-dir {d} is not a directory; it should hold <group>/<option>.yaml files.")
    return tuple(d.resolve() for d in out)
