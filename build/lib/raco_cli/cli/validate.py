"""Validate ``raco train`` overrides before Hydra launches anything.

Hydra reports a bad override with a multi-line message and exit code 1, after creating
output directories; a bad value of ours would surface only inside the job.  Here every
override is parsed, group options are checked against ``conf/``, and the config is
composed and turned into a :class:`RunSpec` - for a multirun once per swept value - so a
bad input gives one line and exit code 2 before any run directory or MLflow record exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from raco_cli.cli.compose_cache import ComposeCache
from raco_cli.cli.job_config import plain_job
from raco_cli.cli.overrides import config_dirs, job_overrides, without_flag_values
from raco_cli.cli.paths import CONF_DIR, GROUPS, group_options
from raco_cli.cli.plugins import register_resolvers
from raco_cli.errors import ConfigError, unknown_name
from raco_cli.run.spec import build_run_spec


def _first_line(exc: BaseException) -> str:
    """Hydra's messages span lines; keep the first and the root cause (last line) on one."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    if exc.__cause__ is not None:  # e.g. "Key 'lrr' is not in struct"
        root = str(exc.__cause__).strip().splitlines()
        if root:
            return (f"{lines[0]} {root[0].replace('is not in struct', 'is not in the config')}; check the key name (raco train --cfg job "
                    "prints the config), or add a new key with a leading + (e.g. +dataset.bounds.age=[18,100])")
    return f"{lines[0]} ({lines[-1]})" if len(lines) > 1 else lines[0]


def _variants(overrides: list[str], extra_dirs: tuple[Path, ...] = ()) -> list[list[str]]:
    """Override lists to compose: the first value of every sweep, then each other value alone."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # noqa: BLE001 - hydra's parse errors
        raise ConfigError(f"Cannot parse overrides {overrides}: {_first_line(exc)}") from None
    base: list[str] = []
    sweeps: list[tuple[int, list[str]]] = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            values = list(o.sweep_string_iterator())
            if not values:
                raise ConfigError(f"Override {o.input_line} sweeps over no values.")
            sweeps.append((len(base), [f"{key}={v}" for v in values]))
            base.append(f"{key}={values[0]}")
        else:
            base.append(str(o.input_line))
        group = o.key_or_group
        if group in GROUPS and not o.is_delete():
            opts = group_options(group, extra_dirs)
            choices: list[object] = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            for v in choices:
                if isinstance(v, str) and v not in opts and not (group in ("experiment", "debug") and v == "null"):
                    raise unknown_name(group, v, opts)
                if isinstance(v, str) and extra_dirs:
                    check_option_file(group, v, extra_dirs)
    variants = [base]
    for pos, values in sweeps:
        for v in values[1:]:
            variant = list(base)
            variant[pos] = v
            variants.append(variant)
    return variants


def check_option_file(group: str, name: str, extra_dirs: tuple[Path, ...]) -> None:
    """One line when a user's own ``<dir>/<group>/<name>.yaml`` (``--config-dir <dir>``) is
    empty, not YAML or not a mapping of keys: Hydra would compose it to nothing and the run
    fail later on a missing key (``Unknown dataset 'None'`` from an empty file that a failed
    ``raco data describe ... > FILE`` left behind)."""
    import yaml

    for root in extra_dirs:
        file = Path(root) / group / f"{name}.yaml"
        if not file.is_file():
            continue
        again = (f"write it again with raco data describe TABLE --label COLUMN --sensitive COLUMN --out {file} "
                 "(docs/your-own-data.md)") if group == "dataset" else f"fix it or remove it (conf/{group}/*.yaml are examples)"
        try:
            content = yaml.safe_load(file.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ConfigError(f"{group}={name}: {file} is not valid YAML ({where}{problem}); {again}.") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{group}={name}: cannot read {file} ({getattr(exc, 'strerror', None) or exc}); {again}.") from None
        if content is None:
            empty = not file.read_text().strip()
            what = "is empty" if empty else "holds no keys (only comments)"
            failed = " (a failed `raco data describe ... > FILE` leaves an empty file)" if empty and group == "dataset" else ""
            raise ConfigError(f"{group}={name}: the {group} config file {file} {what}{failed}; {again}.")
        if not isinstance(content, dict):
            raise ConfigError(f"{group}={name}: the {group} config file {file} holds a {type(content).__name__}, not a mapping of "
                              f"config keys; {again}.")


def _grid_jobs(cfg, overrides: list[str]) -> list[tuple[str, list[list[str]]]]:
    """Per grid of a sweep file (``hydra.sweeper.grids``): the override variants to validate."""
    from omegaconf import OmegaConf

    from raco_cli.cli.sweep_plan import grid_overrides

    sw = OmegaConf.to_container(OmegaConf.select(cfg, "hydra.sweeper") or OmegaConf.create({}), resolve=False)
    assert isinstance(sw, dict)
    grids = sw.get("grids") or {}
    if not grids:
        return []
    only = sw.get("only")
    names = [only] if isinstance(only, str) else list(only or [])
    unknown = [n for n in names if n not in grids]
    if unknown:
        raise ConfigError(f"hydra.sweeper.only names unknown grid(s) {', '.join(unknown)}. Available: {', '.join(grids)}.")
    smoke = bool(sw.get("smoke"))
    out = []
    for name, grid in grids.items():
        if names and name not in names:
            continue
        ovr = grid_overrides(
            grid, overrides, smoke_params=sw.get("smoke_params") if smoke else None,
            smoke_overrides=sw.get("smoke_overrides") if smoke else None,
        )
        try:
            out.append((name, _variants(ovr)))
        except ConfigError as exc:
            raise ConfigError(f"Sweep grid '{name}': {exc} Run the other grids with hydra.sweeper.only=[{','.join(g for g in grids if g != name)}].") from None
    return out


def prevalidate(args: Sequence[str]) -> None:
    """Compose the config for every override variant and validate it; for a sweep file
    (``+sweep=<name>``) also every value of every axis of its grids.

    Raises:
        ConfigError: the first problem, as one line.
    """
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    extra = config_dirs(args)
    overrides = job_overrides(without_flag_values(args))
    variants = _variants(overrides, extra)
    if extra:  # compose as Hydra will: the extra directories join the search path
        searchpath = ",".join(f"file://{d}" for d in extra)
        variants = [[f"hydra.searchpath=[{searchpath}]", *v] for v in variants]
    sweeper_args = [a for a in args if a.lstrip("+").startswith("hydra.sweeper.")]

    def check(variant: list[str], context: str = "") -> None:
        try:
            cfg = composed(variant)
        except Exception as exc:  # noqa: BLE001 - hydra/omegaconf composition errors
            raise ConfigError(f"{context}Invalid override in {variant}: {_first_line(exc)}") from None
        try:
            build_run_spec(plain_job(cfg))
        except ConfigError as exc:
            raise ConfigError(f"{context}{exc}") from None
        except Exception as exc:  # noqa: BLE001 - interpolation errors while resolving
            raise ConfigError(f"{context}Invalid configuration: {_first_line(exc)}") from None

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            # the variants differ mostly in values: each defaults list is composed once
            loader = GlobalHydra.instance().config_loader()
            assert isinstance(loader, ConfigLoaderImpl)
            composed = ComposeCache(loader.repository, lambda structural: compose(config_name="config", overrides=structural))
            for variant in variants:
                check(variant)
            if any(o.lstrip("+").startswith("sweep=") for o in overrides):
                try:
                    full = compose(config_name="config", overrides=[*variants[0], *sweeper_args], return_hydra_config=True)
                except Exception as exc:  # noqa: BLE001 - a bad hydra.sweeper.* value
                    raise ConfigError(f"Invalid override in {sweeper_args}: {_first_line(exc)}") from None
                for name, grid_variants in _grid_jobs(full, overrides):
                    for variant in grid_variants:
                        check(variant, context=f"Sweep grid '{name}': ")
    finally:
        GlobalHydra.instance().clear()


def compose_config(args: Sequence[str]):  # noqa: ANN201 - a DictConfig (hydra is imported lazily)
    """Validate the overrides (as :func:`prevalidate`) and return the composed job config.

    Used by commands that run one job without Hydra's launcher (``raco audit``).

    Raises:
        ConfigError: the first problem, as one line.
    """
    prevalidate(args)
    return compose_job(args)


def compose_job(args: Sequence[str]):  # noqa: ANN201 - a DictConfig (hydra is imported lazily)
    """The job config of ``args`` as Hydra composes it, without validation (callers that
    compose many variants of one validated config, like ``raco tune``'s trials).  ``--config-dir``
    directories join the search path, as under ``raco train``; other flags and ``hydra.*``
    settings do not shape the job."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_resolvers()
    extra = config_dirs(args)
    overrides = job_overrides(without_flag_values(args))
    if extra:
        overrides = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in extra)}]", *overrides]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()
