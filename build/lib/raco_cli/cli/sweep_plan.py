"""A sweep's jobs, planned before anything runs: grids -> override lists -> groups.

Pure functions of the sweep file and the command line (no Hydra composition here, only its
override parser), used by the ``raco`` sweeper (:mod:`raco_cli.cli.sweeper`), ``raco figures``
(the runs a figure's sweep asks for) and the launchers (:mod:`raco_cli.cli.slurm` reads a
group job's members).
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

SMOKE_SUFFIX = "_smoke"  # smoke sweeps record into <experiment>_smoke
GROUP_OVERRIDE = "+raco_group="  # a launcher job's override naming its group file (raco_cli/run/group.py)


def group_members(overrides: Sequence[str]) -> list[dict[str, Any]] | None:
    """The members of a launcher job's group file (None: a job of one run)."""
    from raco_cli.run.group import read_group

    path = next((o[len(GROUP_OVERRIDE):] for o in overrides if o.startswith(GROUP_OVERRIDE)), None)
    return None if path is None else read_group(Path(path))


#: config keys that may differ between the runs of a group (their values are per run in the
#: batched engine; everything else must match for jobs to be grouped)
PER_RUN_KEYS = (
    "seed", "eps", "delta", "constraint.gamma", "constraint.families.*.gamma", "method.lr", "method.lr_dual",
    "method.momentum", "method.noise_multiplier", "method.hist_noise_multiplier", "method.clip_norm", "method.temperature",
    "method.lambda_max", "method.denominator_floor", "method.calibrate_noise", "method.max_steps", "method.options",
    "method.micro_batch", "method.precision", "privacy.selection_share", "dataset.dp_noise_multiplier", "tracking",
)  # fmt: skip
BATCHED_MODELS = ("logreg",)


def group_key(cfg: Mapping[str, Any]) -> str | None:
    """What a job must share with others to join their group (None: it runs alone).

    Everything but :data:`PER_RUN_KEYS` (and whether the clip norm is set).  A group job
    still checks the prepared runs (e.g. ``method.steps=null`` gives each eps its own T) and
    trains apart whatever turns out not to fit together.
    """
    from raco_cli import methods

    method = (cfg.get("method") or {}).get("name")
    if (cfg.get("model") or {}).get("name") not in BATCHED_MODELS or method not in methods.BATCHED:
        return None
    plain = json.loads(json.dumps(cfg, default=str))
    plain["method"]["clip_norm"] = plain["method"].get("clip_norm") is None
    for key in PER_RUN_KEYS:
        if key == "method.clip_norm":
            continue
        parts = key.split(".")
        nodes = [plain]
        for part in parts[:-1]:
            nodes = [v for n in nodes for k, v in n.items() if isinstance(v, dict) and (part == "*" or k == part)]
        for n in nodes:
            n.pop(parts[-1], None)
    return json.dumps(plain, sort_keys=True)


def split_evenly(items: list[Any], cap: int) -> list[list[Any]]:
    """``items`` in order, cut into the fewest chunks of at most ``cap``, of near-equal size.

    >>> [len(c) for c in split_evenly(list(range(10)), 4)]
    [4, 3, 3]
    """
    if not items:
        return []
    count = -(-len(items) // max(cap, 1))
    size, extra = divmod(len(items), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


#: an evaluation (three splits, every metric) costs about this many training steps of the same
#: runs (fig4_adult's groups, docs/batched.md: RaCO-DP evaluating every 5 steps against DP-FERMI
#: every 10 at the same T); only the ratio between a sweep's jobs matters
EVAL_STEPS = 4.0
#: a launcher job's fixed cost (start, data, store, per-step Python) as a share of the mean
#: group's: what splitting a group costs
JOB_OVERHEAD = 0.03


def run_cost(cfg: Mapping[str, Any], *, unknown_steps: float | None = None) -> float:
    """A run's relative training cost: its steps, each evaluation counted as
    :data:`EVAL_STEPS` steps.  ``method.steps`` null (the privacy plan picks T from the data):
    ``unknown_steps`` (the sweep's other jobs' mean), else ``method.max_steps``, the most it
    may take (fig5_heart's RaCO-DP runs: T = 869 of at most 3 000)."""
    method = cfg.get("method") or {}
    steps = float(method.get("steps") or unknown_steps or method.get("max_steps") or 1000)
    every = float(method.get("eval_every") or steps)
    return steps * (1.0 + EVAL_STEPS / max(every, 1.0))


def known_steps(cfgs: Sequence[Mapping[str, Any]]) -> float | None:
    """The mean ``method.steps`` of the configs that set it (None when none does)."""
    steps = [float(s) for c in cfgs if (s := (c.get("method") or {}).get("steps"))]
    return sum(steps) / len(steps) if steps else None


def lpt_makespan(costs: Sequence[float], workers: int) -> float:
    """The time ``workers`` parallel workers take when each takes the next job of ``costs``
    (in that order) as soon as it is free: how joblib's processes run a launch list."""
    free = [0.0] * max(workers, 1)
    for c in costs:
        i = free.index(min(free))
        free[i] += c
    return max(free)


def balance(groups: Sequence[tuple[list[Any], float]], workers: int, *, min_runs: int = 8, max_splits: int = 16) -> list[list[Any]]:
    """Groups of runs (``(runs, cost per run)``) cut and ordered so ``workers`` parallel
    workers finish together: the costliest first (longest-processing-time order), and the
    costliest piece halved while that shortens the estimated wall time (each piece paying a
    fixed :data:`JOB_OVERHEAD`), down to ``min_runs`` runs a piece.  With one worker, or one
    run, the groups are returned as they are.

    Without this a sweep's last group often ran alone: make reproduce's fig5_adult left one
    core idle for 44 s of its 125, fig8a_clipping (one group) for all of its 22.

    >>> [len(p) for p in balance([(list(range(45)), 1.0)], 2)]
    [23, 22]
    >>> [len(p) for p in balance([(list(range(160)), 1.0)] * 3, 2)]
    [160, 160, 80, 80]
    """
    pieces = [(list(runs), float(cost)) for runs, cost in groups if runs]
    if workers <= 1 or not pieces:
        return [runs for runs, _ in pieces]
    fixed = JOB_OVERHEAD * sum(len(r) * c for r, c in pieces) / len(pieces)

    def ordered(ps: list[tuple[list[Any], float]]) -> list[tuple[list[Any], float]]:
        return sorted(ps, key=lambda p: -(len(p[0]) * p[1]))

    def wall(ps: list[tuple[list[Any], float]]) -> float:
        return lpt_makespan([fixed + len(r) * c for r, c in ordered(ps)], workers)

    best, best_wall = pieces, wall(pieces)
    for _ in range(max_splits):  # keep halving the costliest piece; keep the best plan seen
        runs, cost = ordered(pieces)[0]
        if len(runs) < 2 * min_runs:
            break
        halves = split_evenly(runs, -(-len(runs) // 2))
        pieces = [p for p in pieces if p[0] is not runs] + [(h, cost) for h in halves]
        if wall(pieces) < best_wall - 1e-9:
            best, best_wall = pieces, wall(pieces)
    return [runs for runs, _ in ordered(best)]


def _key(key: str) -> str:
    """Override key without its ``+``/``++``/``~`` prefix (for matching axes)."""
    return key.lstrip("+~")


def _value(value: Any) -> str:
    """A YAML value as override text (lists become Hydra sweeps)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return ",".join(_value(v) for v in value)
    return str(value)


def grid_overrides(
    grid: Mapping[str, Any],
    arguments: Sequence[str],
    *,
    smoke_params: Mapping[str, Any] | None = None,
    smoke_overrides: Mapping[str, Any] | None = None,
) -> list[str]:
    """Override strings of one grid: grid axes, then smoke replacements, then the command line.

    Later entries win per key (without ``+`` prefixes), so the command line always wins.

    >>> grid_overrides({"eps": "1,2", "seed": "range(0,20)"}, ["seed=0"], smoke_params={"seed": "range(0,2)"})
    ['eps=1,2', 'seed=0']
    """
    merged: OrderedDict[str, str] = OrderedDict()
    for key, value in grid.items():
        merged[_key(key)] = f"{key}={_value(value)}"
    for key, value in (smoke_params or {}).items():
        if _key(key) in merged:
            merged[_key(key)] = f"{merged[_key(key)].split('=', 1)[0]}={_value(value)}"
    for key, value in (smoke_overrides or {}).items():
        merged[_key(key)] = f"{key}={_value(value)}"
    for arg in arguments:
        key = arg.split("=", 1)[0]
        merged.pop(_key(key), None)
        merged[_key(key)] = arg
    return list(merged.values())


def expand(overrides: Sequence[str]) -> list[list[str]]:
    """The cartesian product of a list of (sweep) overrides, as job override lists."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    axes = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            axes.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([f"{key}={o.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*axes)]


def plan_jobs(
    grids: Mapping[str, Mapping[str, Any]] | None,
    params: Mapping[str, Any] | None,
    arguments: Sequence[str],
    *,
    only: Sequence[str] | None = None,
    smoke: bool = False,
    smoke_params: Mapping[str, Any] | None = None,
    smoke_overrides: Mapping[str, Any] | None = None,
) -> list[tuple[str, list[str]]]:
    """All jobs of a sweep as ``(grid name, overrides)``, grids in file order.

    Raises:
        ConfigError: ``only`` names a grid the sweep does not define.
    """
    from raco_cli.errors import ConfigError

    sp = smoke_params if smoke else None
    so = smoke_overrides if smoke else None
    if not grids:
        base = [f"{k}={_value(v)}" for k, v in (params or {}).items()]
        return [("", job) for job in expand(grid_overrides({}, [*base, *arguments], smoke_params=sp, smoke_overrides=so))]
    selected = list(grids)
    if only:
        unknown = [g for g in only if g not in grids]
        if unknown:
            raise ConfigError(
                f"hydra.sweeper.only names unknown grid(s) {', '.join(unknown)}. Available: {', '.join(grids)}."
            )
        selected = [g for g in grids if g in only]
    jobs: list[tuple[str, list[str]]] = []
    for name in selected:
        ovr = grid_overrides(grids[name], arguments, smoke_params=sp, smoke_overrides=so)
        jobs.extend((name, job) for job in expand(ovr))
    return jobs
