"""A composed config -> typed, validated specs (the first thing a run does).

Type and range errors become one-line :class:`ConfigError` messages naming the key, the
value, what is allowed and what it means.  Registry names are checked here too, so calls
from Python get the same messages as the CLI.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from raco_cli.errors import CHOICE, DELTA_RANGE, EPS_RANGE, TYPE, ConfigError, unknown_name
from raco_cli.methods.base import SCOPES, MethodSpec
from raco_cli.privacy.limits import check_noise

# keys excluded from the config hash: they do not change what a run computes (where the
# data files are read from is checksum-verified; the device changes nothing but speed).
# `threads` is in: it changes the step times a timing sweep (Table 2) measures.
# Everything else is in, the seed included: the hash identifies one computation.
TASK_CHOICES = ("auto", "classification", "regression")
MAX_RHO = 1e4  # rho-zCDP budgets far beyond any meaningful guarantee (rho = 50 is eps ~ 92 at delta 1e-5)
# MethodSpec fields the run layer sets (scope, noise source, private selection, preprocessing
# and size releases): not settable as method.<key>
RUN_LEVEL = ("secure_rng", "scope", "selection_eps", "preprocessing_noise", "size_noise", "train_size", "estimate_noise",
             "certificate_noise", "reserved_delta", "objective")
_HASH_EXCLUDED = ("tracking", "hydra", "device", "paths", "dataset.mirror", "dataset.download", "method.tuned_on")


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    split_seed: int
    subset: int | None
    download: bool
    mirror: str | None
    data_dir: Path
    options: Mapping[str, Any]
    preprocessing: str = "empirical"  # public | dp | empirical (resolved from dataset.preprocessing)
    split: str = "stratified"  # record | stratified (resolved from dataset.split: auto follows privacy.scope)
    bounds: Mapping[str, Any] = field(default_factory=dict)  # dataset.bounds: public column ranges
    dp_noise_multiplier: float = 20.0  # dataset.dp_noise_multiplier: the DP standardisation's Gaussian
    imbalance: Mapping[str, Any] = field(default_factory=dict)  # dataset.imbalance: label/group-imbalanced variant
    estimate_noise_multiplier: float = 20.0  # dataset.estimate_noise_multiplier: the Gaussian of a table's private estimates
    title: str = ""  # the name runs and summaries carry: the dataset, or a table's name (dataset.options.name, else the file stem)

    @property
    def display(self) -> str:
        return self.title or self.name


@dataclass(frozen=True)
class ConstraintSpec:
    """The constraints of a run.

    Attributes:
        name: the run's constraint label: a family (``dp``), ``none``, or the parts of a
            combination joined by ``+`` (``dp+fnr``).
        gamma: ``constraint.gamma`` (for a combination: the default of parts without their own).
        parts: one :class:`PartSpec` per family (empty for ``none``).
        keys: config path of each part, for messages.
        confidence: ``constraint.confidence`` resolved (``auto``: 0.9 under
            ``privacy.scope=model``, None under ``paper``); see :mod:`raco_cli.constraints.margin`.
    """

    name: str
    gamma: float
    parts: tuple[Any, ...] = ()
    keys: tuple[str, ...] = ()
    confidence: float | None = None  # constraint.confidence (resolved): hold on new data w.p. >= this; None: train against gamma
    confidence_auto: bool = False  # it came from auto: a margin the data cannot support warns and trains against gamma


@dataclass(frozen=True)
class TrackingSpec:
    enabled: bool
    uri: str | None
    experiment: str
    run_name: str | None
    curves: bool | str = "auto"  # tracking.curves: draw curves.png (auto: single runs yes, sweep jobs no)


@dataclass(frozen=True)
class RunSpec:
    """Everything a training run needs, validated."""

    eps: float
    delta: float
    seed: int
    device: str
    discretization: float
    secure_rng: bool
    dataset: DatasetSpec
    constraint: ConstraintSpec
    method: MethodSpec
    model: Mapping[str, Any]
    tracking: TrackingSpec
    config_hash: str
    threads: int | None = None  # torch CPU threads (None: torch's default)
    scope: str = "model"  # privacy.scope: model | paper (what eps covers; docs/privacy.md)
    delta_exponent: float | None = None  # privacy.delta_exponent: delta = n_train^-exponent (set once the data is loaded)
    task: str = "auto"  # task: auto (the dataset's) | classification | regression
    rho: float | None = None  # privacy.rho: a rho-zCDP budget; eps is then derived from it (docs/dpse.md)
    size_noise_multiplier: float = 50.0  # privacy.size_noise_multiplier: Gaussian noise (rows) of the DP training-size count
    certificate_noise_multiplier: float = 10.0  # privacy.certificate_noise_multiplier: Gaussian noise (rows) of the certificate's counts
    tuned_on: Mapping[str, Any] | None = None  # method.tuned_on: where the hyperparameters were chosen (dataset, split, protocol)
    auto_batch: bool = False  # method.batch_size=auto: chosen from the (DP) training size by prepare_run
    auto_lr_dual: bool = False  # method.lr_dual=auto: chosen from the plan and the (DP) cell sizes by prepare_run
    auto_dual: bool = False  # method.dual=auto: hard rates when a confidence margin applies, else soft (prepare_run)


def _number(cfg: Mapping[str, Any], key: str, path: str, meaning: str) -> float:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(TYPE.format(key=path, expected="a number", value=value, meaning=meaning))
    return float(value)


def _integer(cfg: Mapping[str, Any], key: str, path: str, meaning: str, *, optional: bool = False) -> int | None:
    value = cfg.get(key)
    if value is None and optional:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(TYPE.format(key=path, expected="an integer", value=value, meaning=meaning))
    return value


def _boolean(cfg: Mapping[str, Any], key: str, path: str, meaning: str) -> bool:
    value = cfg.get(key)
    if not isinstance(value, bool):
        raise ConfigError(TYPE.format(key=path, expected="true or false", value=value, meaning=meaning))
    return value


def _string(cfg: Mapping[str, Any], key: str, path: str, meaning: str, *, optional: bool = False) -> str | None:
    value = cfg.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(TYPE.format(key=path, expected="a non-empty string", value=value, meaning=meaning))
    return value


def _method_spec(cfg: Mapping[str, Any], **run_level: Any) -> MethodSpec:
    """The ``method`` group as a :class:`MethodSpec` with the run-level fields ``run_level``
    (scope, secure_rng, objective); an ``auto`` value is left to the spec's own defaults
    (:data:`raco_cli.defaults.AUTO_PLACEHOLDERS`) and resolved by ``prepare_run``."""
    from raco_cli import methods

    name = cfg.get("name")
    if name not in methods.METHODS:
        raise unknown_name("method", name, methods.METHODS)
    kwargs: dict[str, Any] = {}
    known = {f.name: f for f in fields(MethodSpec) if f.name not in RUN_LEVEL}
    for key, value in cfg.items():
        if key == "tuned_on":  # provenance of the values (RunSpec.tuned_on), not a setting
            continue
        if key == "batch_size" and value == "auto":  # RunSpec.auto_batch: resolved from the training size by prepare_run
            continue
        if key == "lr_dual" and value == "auto":  # RunSpec.auto_lr_dual: resolved from the plan and cell sizes by prepare_run
            continue
        if key == "dual" and value == "auto":  # RunSpec.auto_dual: resolved by prepare_run once the margins are known
            continue
        if key not in known:
            raise ConfigError(
                f"Unknown key method.{key}. Allowed: {', '.join(sorted(known))}. "
                "Method-specific settings go under method.options."
            )
        kwargs[key] = value
    for key in ("lr", "lr_dual", "lambda_max", "temperature", "denominator_floor", "momentum",
                "clip_norm", "noise_multiplier", "hist_noise_multiplier"):
        value = kwargs.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            kwargs[key] = float(value)
        elif value is not None and not isinstance(value, float):
            auto = key == "lr_dual"  # lr_dual=auto never reaches here: resolved by prepare_run
            raise ConfigError(TYPE.format(key=f"method.{key}", expected="a number" + (" or auto" if auto else ""), value=value,
                                          meaning="see conf/method/<name>.yaml for its meaning."))
    for key in ("batch_size", "steps", "max_steps", "eval_every", "micro_batch"):
        if key in kwargs:
            kwargs[key] = _integer(kwargs, key, f"method.{key}", "a count, or auto (from the training size)." if key == "batch_size"
                                   else "a count.", optional=key == "steps")
    if "calibrate_noise" in kwargs:
        kwargs["calibrate_noise"] = _boolean(kwargs, "calibrate_noise", "method.calibrate_noise",
                                             "scale the noise to meet eps for a fixed number of steps.")
    kwargs["options"] = dict(kwargs.get("options") or {})
    return MethodSpec(**kwargs, **run_level)


def _constraint_spec(con: Mapping[str, Any], *, scope: str) -> ConstraintSpec:
    """``constraint`` config -> :class:`ConstraintSpec` (structure checked, names resolved later
    against the data by :func:`raco_cli.constraints.build_parts`)."""
    raw = con.get("confidence", "auto")
    confidence = _confidence(raw, scope)
    con = {k: v for k, v in con.items() if k != "confidence"}
    return replace(_constraint_parts(con), confidence=confidence, confidence_auto=raw == "auto")


DEFAULT_CONFIDENCE = 0.9


def _confidence(value: Any, scope: str) -> float | None:
    """``constraint.confidence``: auto (0.9 under scope=model, none under paper), null, or a
    probability in (0, 1).

    >>> _confidence("auto", "model"), _confidence("auto", "paper"), _confidence(0.95, "paper"), _confidence(None, "model")
    (0.9, None, 0.95, None)
    """
    if value == "auto":
        return DEFAULT_CONFIDENCE if scope == "model" else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise ConfigError(TYPE.format(key="constraint.confidence", expected="auto, null or a probability in (0, 1)", value=value,
                                      meaning="the model meets every rate constraint on new data with at least this probability "
                                              "(auto: 0.9 under privacy.scope=model)."))
    return float(value)


def _constraint_parts(con: Mapping[str, Any]) -> ConstraintSpec:
    from raco_cli import constraints
    from raco_cli.errors import GAMMA_RANGE

    name = con.get("name")
    if name not in constraints.NAMES:
        raise unknown_name("constraint", name, constraints.NAMES)
    gamma = _number(con, "gamma", "constraint.gamma", "gamma is the allowed gap of each rate constraint.")
    if name != "custom" and (gamma < 0 or math.isnan(gamma)):
        raise ConfigError(GAMMA_RANGE.format(value=gamma))
    if name == "none":
        return ConstraintSpec(name="none", gamma=gamma)
    if name != constraints.COMBO:
        raw = {k: v for k, v in con.items()}
        part = constraints.part_spec(name, raw, key="constraint")
        return ConstraintSpec(name=name, gamma=gamma, parts=(part,), keys=("constraint",))
    allowed = ("name", "gamma", "parts", "families")
    for k in con:
        if k not in allowed:
            raise ConfigError(f"Unknown key constraint.{k} for constraint=combo. Allowed: {', '.join(allowed)}.")
    names = constraints.parse_parts(con.get("parts"), key="constraint.parts")
    fams = con.get("families") or {}
    parts, keys = [], []
    for fam in names:
        raw = dict(fams.get(fam) or {})
        # the family's own file brings its confidence: auto; confidence is the run's (constraint.confidence)
        if raw.pop("confidence", "auto") != "auto":
            raise ConfigError(f"constraint.families.{fam}.confidence cannot be set per part (got "
                              f"constraint.families.{fam}.confidence={fams[fam]['confidence']!r}); the confidence covers every "
                              "constraint of the run at once: set constraint.confidence.")
        if raw.get("name", fam) != fam:
            raise ConfigError(f"constraint.families.{fam}.name must be {fam} (got {raw['name']!r}).")
        key = f"constraint.families.{fam}"
        parts.append(constraints.part_spec(fam, raw, key=key, default_gamma=gamma))
        keys.append(key)
    label = "+".join(names) if names else "none"
    return ConstraintSpec(name=label, gamma=gamma, parts=tuple(parts), keys=tuple(keys))


def config_hash(cfg: Mapping[str, Any]) -> str:
    """A stable hash of what a run computes (excludes tracking, paths, device, hydra, where
    the data is read from); the seed is included.  Sweeps skip jobs whose hash already has a
    FINISHED run in the experiment (:mod:`raco_cli.cli.sweeper`).

    >>> config_hash({"seed": 0, "tracking": {"uri": "a"}}) == config_hash({"seed": 0, "tracking": {"uri": "b"}})
    True
    >>> config_hash({"seed": 0}) == config_hash({"seed": 1})
    False
    >>> config_hash({"eps": 1}) == config_hash({"eps": 1.0})
    True
    """
    plain = _without(cfg, _HASH_EXCLUDED)
    blob = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _without(cfg: Mapping[str, Any], excluded: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if path in excluded:
            continue
        out[key] = _without(value, excluded, path + ".") if isinstance(value, Mapping) else _canonical(value)
    return out


def _canonical(value: Any) -> Any:
    """``eps=1`` and ``eps=1.0`` compute the same run: numbers hash as floats."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _curves(value: Any) -> bool | str:
    if isinstance(value, bool) or value == "auto":
        return value
    raise ConfigError(TYPE.format(key="tracking.curves", expected="true, false or auto", value=value,
                                  meaning="draw curves.png (auto: single runs yes, sweep jobs no)."))


def plain_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config as plain containers (MLflow params, summary.json, config.yaml).

    The command line hands the run layer plain dicts: it converts Hydra's ``DictConfig`` with
    OmegaConf (:func:`raco_cli.cli.job_config.plain_job`), which only the command line imports.
    A plain dict is copied as it is; any other mapping (a ``DictConfig`` a caller composed itself,
    as tests do) is read key by key into dicts and lists, its interpolations resolved as read.

    >>> plain_config({"eps": 1.0, "method": {"name": "sgd"}})
    {'eps': 1.0, 'method': {'name': 'sgd'}}
    """
    from collections.abc import Sequence

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            return [plain(v) for v in value]
        return value

    if isinstance(cfg, dict):
        return dict(cfg)
    return {str(k): plain(v) for k, v in cfg.items()}


def build_run_spec(cfg: Mapping[str, Any]) -> RunSpec:
    """Validate a composed config (a plain mapping or Hydra's ``DictConfig``) and turn it
    into a :class:`RunSpec`.

    Raises:
        ConfigError: the first invalid value, as one line.
    """
    from raco_cli import data, models

    c = plain_config(cfg)
    eps = _number(c, "eps", "eps", "eps is the total privacy budget of the run.")
    if not eps > 0 or math.isnan(eps):
        raise ConfigError(EPS_RANGE.format(value=eps))
    delta = _number(c, "delta", "delta", "delta is the failure probability of the guarantee.")
    if not 0 < delta < 1:
        raise ConfigError(DELTA_RANGE.format(value=delta))
    task = c.get("task", "auto")
    if task not in TASK_CHOICES:
        raise ConfigError(CHOICE.format(key="task", choices=", ".join(TASK_CHOICES), value=task,
                                        meaning="auto follows the dataset (group_mixture: regression, the others: classification)."))
    seed = _integer(c, "seed", "seed", "the run seed.")
    if seed is None or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer (got seed={seed}).")
    device = _string(c, "device", "device", "auto, cpu, cuda or cuda:N.")
    threads = _integer(c, "threads", "threads", "the number of torch CPU threads (or null).", optional=True)
    if threads is not None and threads < 1:
        raise ConfigError(f"threads must be a positive integer or null (got threads={threads}); null keeps torch's default.")
    assert device is not None
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:") or device == "mps"):
        raise ConfigError(f"device must be one of auto, cpu, cuda, cuda:N (got device={device!r}).")
    privacy = c.get("privacy") or {}
    discretization = _number(privacy, "discretization", "privacy.discretization", "the PLD loss grid.")
    from raco_cli.privacy.limits import check_discretization

    check_discretization("privacy.discretization", discretization)
    rho = privacy.get("rho")
    if rho is not None:
        rho = _number(privacy, "rho", "privacy.rho", "a rho-zCDP budget (null: use eps).")
        if not 0 < rho <= MAX_RHO:
            raise ConfigError(f"privacy.rho must be in (0, {MAX_RHO:g}] or null (got privacy.rho={rho:g}); it is a rho-zCDP budget "
                              "(the DPSE paper's 2, 4.5, 8), used instead of eps.")
        from raco_cli.privacy.accountant import rho_epsilon

        # the accountant converts: eps of the rho-zCDP Gaussian at delta (docs/dpse.md)
        eps = rho_epsilon(rho, delta, discretization=discretization)
    scope = privacy.get("scope", "model")
    if scope not in SCOPES:
        raise ConfigError(CHOICE.format(key="privacy.scope", choices=", ".join(SCOPES), value=scope,
                                        meaning="model: eps covers the model and every record; paper: the paper's protocol."))
    secure_rng = _secure_rng(privacy.get("secure_rng", "auto"), scope)
    size_noise = _number({"s": privacy.get("size_noise_multiplier", 50.0)}, "s", "privacy.size_noise_multiplier",
                         "the noise multiplier of the DP count of the training rows (scope=model).")
    if not math.isfinite(size_noise) or size_noise <= 0:
        raise ConfigError(f"privacy.size_noise_multiplier must be a positive finite number (got privacy.size_noise_multiplier="
                          f"{size_noise}); it is the Gaussian noise (in rows) of the DP count of the training rows (default 50).")
    certificate_noise = _number({"s": privacy.get("certificate_noise_multiplier", 10.0)}, "s",
                                "privacy.certificate_noise_multiplier",
                                "the noise multiplier of the certificate's validation counts (scope=model).")
    if not math.isfinite(certificate_noise) or not 1 <= certificate_noise <= 1e6:
        raise ConfigError(f"privacy.certificate_noise_multiplier must be a number in [1, 1e6] (got "
                          f"privacy.certificate_noise_multiplier={certificate_noise}); it is the Gaussian noise (in rows) of the "
                          "released model's validation counts that certify constraint.confidence (default 10).")
    share = _number({"s": privacy.get("selection_share", 0.05)}, "s", "privacy.selection_share",
                    "the share of eps spent on the private checkpoint choice.")
    if not 0 < share < 1:
        raise ConfigError(f"privacy.selection_share must be in (0, 1) (got privacy.selection_share={share}); "
                          "it is the share of eps spent on the private checkpoint choice (e.g. 0.05).")

    ds = c.get("dataset") or {}
    ds_name = ds.get("name")
    if ds_name is None:  # a user's dataset file that neither names a loader nor extends one
        raise ConfigError("dataset.name is not set: the dataset config names no loader; a file of your own table starts with "
                          "`defaults: [table, _self_]` (what raco data describe TABLE --label COLUMN --sensitive COLUMN --out FILE "
                          f"writes), another sets `name:` (one of {', '.join(sorted(data.DATASETS))}).")
    if ds_name not in data.DATASETS:
        raise unknown_name("dataset", ds_name, data.DATASETS)
    subset = _integer(ds, "subset", "dataset.subset", "rows kept per split (null = all).", optional=True)
    split_seed = int(_integer(ds, "split_seed", "dataset.split_seed", "the fixed split seed.") or 0)
    if not 0 <= split_seed < 2**32:  # numpy / scikit-learn seed range
        raise ConfigError(f"dataset.split_seed must be an integer in [0, 2^32 - 1] (got dataset.split_seed={split_seed}).")
    if subset is not None and subset < 10:
        raise ConfigError(f"dataset.subset must be >= 10 or null (got {subset}).")
    mirror = ds.get("mirror")
    preprocessing = ds.get("preprocessing", "auto")
    if preprocessing not in ("auto", "public", "dp", "empirical"):  # raco_cli.data.tabular.PREPROCESSING + dp
        raise ConfigError(CHOICE.format(key="dataset.preprocessing", choices="auto, public, dp, empirical", value=preprocessing,
                                        meaning="auto follows privacy.scope (model: dp standardisation within public bounds, "
                                                "paper: empirical statistics)."))
    if preprocessing == "auto":
        preprocessing = "dp" if scope == "model" else "empirical"
    split = ds.get("split", "auto")
    if split not in ("auto", "record", "stratified"):  # (raco_cli.data.tabular.SPLITS)
        raise ConfigError(CHOICE.format(key="dataset.split", choices="auto, record, stratified", value=split,
                                        meaning="record: each row's split from its own cells (adding or removing a row moves no other); "
                                                "stratified: the paper's seeded shuffle of the whole file; auto follows privacy.scope "
                                                "(model: record, paper: stratified)."))
    if split == "auto":
        split = "record" if scope == "model" else "stratified"
    if split == "stratified" and scope == "model":  # a neighbouring file would move other rows into the exact test split
        raise ConfigError("dataset.split=stratified: the whole-file shuffle is refused under privacy.scope=model (one row added "
                          "or removed moves others between train and the exactly evaluated test split); use dataset.split=auto "
                          "(record) or privacy.scope=paper.")
    dp_noise = _number({"s": ds.get("dp_noise_multiplier", 20.0)}, "s", "dataset.dp_noise_multiplier",
                       "the noise multiplier of the DP standardisation (dataset.preprocessing=dp).")
    if not math.isfinite(dp_noise):
        raise ConfigError(f"dataset.dp_noise_multiplier must be a finite number (got dataset.dp_noise_multiplier={dp_noise}); "
                          "the noise multiplier of the DP standardisation (default 20).")
    check_noise("dataset.dp_noise_multiplier", dp_noise)
    bounds = ds.get("bounds") or {}
    if not isinstance(bounds, Mapping):
        raise ConfigError(TYPE.format(key="dataset.bounds", expected="a mapping column -> [lo, hi]", value=bounds,
                                      meaning="public feature bounds (conf/dataset/<name>.yaml)."))
    from raco_cli.data.provenance import data_derived, refusal

    derived = data_derived(ds)
    if derived and scope == "model":  # a value read from the data is not private (docs/privacy.md)
        raise ConfigError(refusal(derived))
    estimate_noise = _number({"s": ds.get("estimate_noise_multiplier", 20.0)}, "s", "dataset.estimate_noise_multiplier",
                             "the noise multiplier of a table's private estimates (private bounds / levels).")
    if not math.isfinite(estimate_noise) or estimate_noise <= 0:
        raise ConfigError(f"dataset.estimate_noise_multiplier must be a positive finite number (got dataset.estimate_noise_multiplier="
                          f"{estimate_noise}); the Gaussian noise multiplier of a table's private estimates (default 20).")
    dataset = DatasetSpec(
        name=ds_name,
        split_seed=split_seed,
        subset=subset,
        download=_boolean(ds, "download", "dataset.download", "download missing files."),
        mirror=str(mirror) if mirror else None,
        data_dir=Path(str((c.get("paths") or {}).get("data_dir") or "datasets")),
        options=dict(ds.get("options") or {}),
        preprocessing=str(preprocessing),
        split=str(split),
        bounds=dict(bounds),
        dp_noise_multiplier=float(dp_noise),
        imbalance=_imbalance(ds.get("imbalance")),
        estimate_noise_multiplier=float(estimate_noise),
        title=_title(ds_name, ds.get("options") or {}),
    )

    constraint = _constraint_spec(c.get("constraint") or {}, scope=scope)

    method_cfg = dict(c.get("method") or {})
    if method_cfg.get("selection") == "auto":
        # scope=model: the tail average (free post-processing; the private best-feasible pick
        # varied by 0.05 in test DP gap between seeds on Adult, docs/methods.md); scope=paper:
        # the paper's App. E.2 rule
        method_cfg["selection"] = "average" if scope == "model" else "best_feasible"
    method = _method_spec(method_cfg, secure_rng=secure_rng, scope=scope,
                          objective=_objective_spec(c.get("objective"), method_name=str((c.get("method") or {}).get("name"))))
    if method.selection == "random" and not method.objective.is_dro:
        raise ConfigError("method.selection=random (the random-iterate output of the DRO methods) needs objective=dro; "
                          "use method.selection=best_feasible or last.")
    if scope == "model" and method.selection == "best_feasible":
        method = replace(method, selection_eps=share * eps)
    delta_exponent = privacy.get("delta_exponent")
    if delta_exponent is not None and (isinstance(delta_exponent, bool) or not isinstance(delta_exponent, (int, float))
                                       or not 1.0 <= delta_exponent <= 3.0):
        raise ConfigError(f"privacy.delta_exponent must be null or a number in [1, 3] (got privacy.delta_exponent={delta_exponent!r}); "
                          "when set, delta = n_train^-exponent (e.g. 1.1, the DP-DRO paper's delta = 1/n^1.1).")
    if delta_exponent is not None and rho is not None:  # rho -> eps was converted at the configured delta above
        raise ConfigError(f"privacy.delta_exponent={delta_exponent!r} cannot be combined with privacy.rho={rho:g} (rho is converted "
                          "to eps at the configured delta); set one of them to null.")
    model = dict(c.get("model") or {})
    if model.get("name") not in models.MODELS:
        raise unknown_name("model", model.get("name"), models.MODELS)

    tr = c.get("tracking") or {}
    enabled = _boolean(tr, "enabled", "tracking.enabled", "record the run in MLflow.")
    tracking = TrackingSpec(
        enabled=enabled,
        uri=_string(tr, "uri", "tracking.uri", "the MLflow tracking URI.", optional=not enabled),
        experiment=str(_string(tr, "experiment", "tracking.experiment", "the MLflow experiment name.")),
        run_name=_string(tr, "run_name", "tracking.run_name", "the MLflow run name.", optional=True),
        curves=_curves(tr.get("curves", "auto")),
    )
    return RunSpec(
        eps=eps,
        delta=delta,
        seed=seed,
        device=device,
        discretization=discretization,
        secure_rng=secure_rng,
        dataset=dataset,
        constraint=constraint,
        method=method,
        model=model,
        tracking=tracking,
        config_hash=config_hash(c),
        threads=threads,
        scope=scope,
        delta_exponent=None if delta_exponent is None else float(delta_exponent),
        task=str(task),
        rho=rho,
        size_noise_multiplier=float(size_noise),
        certificate_noise_multiplier=float(certificate_noise),
        tuned_on=_tuned_on((c.get("method") or {}).get("tuned_on")),
        auto_batch=(c.get("method") or {}).get("batch_size") == "auto",
        auto_lr_dual=(c.get("method") or {}).get("lr_dual") == "auto",
        auto_dual=(c.get("method") or {}).get("dual") == "auto",
    )


def _title(name: str, options: Mapping[str, Any]) -> str:
    """What runs of a dataset are called: its name; a table's ``dataset.options.name``, else the
    stem of its (first) file.

    >>> _title("table", {"path": "/data/credit-g.csv.gz"}), _title("table", {"name": "loans", "path": "x.csv"}), _title("adult", {})
    ('credit-g', 'loans', 'adult')
    """
    if name != "table":
        return name
    if isinstance(options.get("name"), str) and options["name"]:
        return str(options["name"])
    path = options.get("path")
    first = path[0] if isinstance(path, (list, tuple)) and path else path
    if not isinstance(first, str) or not first:
        return name
    stem = Path(first).name
    for suffix in (".gz", ".csv", ".tsv", ".txt", ".parquet"):
        stem = stem.removesuffix(suffix)
    return stem or name


TUNED_PROTOCOLS = ("non-private", "private")


def _tuned_on(value: Any) -> dict[str, Any] | None:
    """``method.tuned_on``: null, or ``{dataset, split, protocol, ...}`` recording where the
    method's values were chosen (``protocol: non-private`` = exact validation/train statistics,
    outside eps; ``private`` = ``raco tune`` under scope=model, inside eps)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value.get("dataset") or value.get("protocol") not in TUNED_PROTOCOLS:
        raise ConfigError(TYPE.format(key="method.tuned_on", expected="null or a mapping with dataset, split and protocol "
                                      f"({' or '.join(TUNED_PROTOCOLS)})", value=value,
                                      meaning="where the method's hyperparameters were chosen (docs/privacy.md)."))
    return dict(value)


def _secure_rng(value: Any, scope: str) -> bool:
    """``privacy.secure_rng``: true, false, or auto (true under scope=model, false under paper).

    >>> _secure_rng("auto", "model"), _secure_rng("auto", "paper"), _secure_rng(False, "model")
    (True, False, False)
    """
    if value == "auto" or value is None:
        return scope == "model"
    if isinstance(value, bool):
        return value
    raise ConfigError(TYPE.format(key="privacy.secure_rng", expected="true, false or auto", value=value,
                                  meaning="secret noise and batches from the OS CSPRNG (auto: true under privacy.scope=model)."))


def _imbalance(cfg: Any) -> dict[str, Any]:
    """``dataset.imbalance`` (null or a mapping; :mod:`raco_cli.data.imbalance`)."""
    from raco_cli.data.imbalance import check

    if cfg is None:
        return {}
    if not isinstance(cfg, Mapping):
        raise ConfigError(TYPE.format(key="dataset.imbalance", expected="null or a mapping", value=cfg,
                                      meaning="label_ratio / group_ratio of the imbalanced variant (docs/dro.md)."))
    checked = check(cfg)
    return {k: v for k, v in checked.items() if v is not None} if any(checked[k] is not None for k in ("label_ratio", "group_ratio")) else {}


def _objective_spec(cfg: Any, *, method_name: str) -> Any:
    """``objective`` config -> :class:`~raco_cli.objectives.ObjectiveSpec`, checked against what
    the method optimises (``raco_cli.methods.OBJECTIVES``).

    Raises:
        ConfigError: a bad value, or an objective the method does not optimise.
    """
    from raco_cli import methods
    from raco_cli.objectives import objective_spec

    if cfg is not None and not isinstance(cfg, Mapping):
        raise ConfigError(TYPE.format(key="objective", expected="a mapping", value=cfg, meaning="the objective config group (erm or dro)."))
    objective = objective_spec(dict(cfg) if cfg else None)
    supported = methods.objectives_of(method_name)
    if objective.name not in supported:
        if objective.name == "dro":
            dro = sorted(name for name in methods.METHODS if "dro" in methods.objectives_of(name))
            raise ConfigError(f"method={method_name} does not optimise objective=dro. Use one of: {', '.join(dro)}.")
        raise ConfigError(f"method={method_name} optimises objective=dro only; add objective=dro (docs/dro.md).")
    return objective
