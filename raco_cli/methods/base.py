"""The method interface: a typed spec in, a :class:`TrainResult` out.

A method (a module, or an object with the same attributes such as the DRO family's
:class:`raco_cli.methods.dro.methods.DroMethod`; :data:`Method`) exposes

* ``NAME`` and ``PRIVATE`` (bool),
* ``step_event(spec, sample_rate, *, constrained) -> DpEvent``: the releases of one step,
* optionally ``run_event(spec, sample_rate, steps, *, constrained) -> DpEvent`` when a run is
  not simply ``SelfComposed(step_event, steps)`` (e.g. a first stage before training);
  :func:`raco_cli.methods.planning.run_event` picks whichever the method defines,
* optionally ``validate(spec, constraints, data) -> None``: raises a one-line
  :class:`~raco_cli.errors.RacoError` (``UnsupportedError`` for a constraint the method does
  not model, ``ConfigError`` for bad ``method.options``) *before* anything is run or recorded,
* optionally ``FULL_BATCH = True``: every step uses all training rows (no Poisson sampling;
  the sample rate is 1 and ``batch_size`` is ignored),
* optionally ``TASKS``: the tasks it trains (default ``("classification",)``; with
  ``"regression"`` it takes the squared loss on a real-valued ``data.target``),
* ``fit(data, model, constraints, spec, *, steps, seeds, device, reporter) -> TrainResult``,
* optionally ``fit_many(data, members, *, steps, device, reporter=None) -> list[TrainResult]``:
  the runs of a sweep group (:class:`raco_cli.methods.batched.Member`) trained as one
  vectorised problem, each run equal to its ``fit`` (docs/batched.md).

Methods never log to MLflow or print: they report through a :class:`Reporter`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from raco_cli.errors import (
    CHOICE,
    IN_RANGE,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
)
from raco_cli.objectives import ObjectiveSpec
from raco_cli.privacy.limits import check_noise

Selection = Literal["best_feasible", "last", "random", "average"]
Dual = Literal["soft", "hard"]
Optimizer = Literal["sgd", "momentum", "adam"]
SCOPES = ("model", "paper")  # privacy.scope: what the printed eps covers (docs/privacy.md)
# a method as the registry returns it (module docstring): its optional members are probed with
# getattr / hasattr, so it is typed no closer than this
Method = Any


class _Unset:
    """What a :class:`MethodSpec` field holds until ``__post_init__`` fills it from the packaged
    configs (:mod:`raco_cli.defaults`)."""

    def __repr__(self) -> str:
        return "<from conf/method/<name>.yaml>"


UNSET: Any = _Unset()

#: a method-file key's value when the method's own file does not set it (a DRO method's file
#: names only what it uses); the schema's one other source of defaults
UNSET_IN_FILE: dict[str, Any] = {
    "batch_size": 1024, "steps": None, "max_steps": 2000, "lr": 0.5, "optimizer": "sgd", "momentum": 0.9, "clip_norm": 1.0,
    "noise_multiplier": 1.0, "hist_noise_multiplier": 2.0, "calibrate_noise": False, "lr_dual": 0.1, "lambda_max": 10.0,
    "temperature": 1.0, "dual": "soft", "sampling": "independent", "denominator_floor": 1.0, "eval_every": 20,
    "selection": "auto", "micro_batch": 4096, "options": {},
}


@dataclass(frozen=True)
class MethodSpec:
    """Hyperparameters of a training run (the ``method`` config group plus run-level keys).

    Every setting not given is read from the packaged configs (:mod:`raco_cli.defaults`): the
    method's ``conf/method/<name>.yaml`` (an ``auto`` held as
    :data:`raco_cli.defaults.AUTO_PLACEHOLDERS` until ``prepare_run`` resolves it), and
    ``privacy.scope`` / ``privacy.secure_rng`` of ``conf/config.yaml`` (``model``, with secret
    randomness), so a spec built in Python is the one ``raco train method=<name>`` builds.

    Attributes:
        name: method registry key.
        batch_size: expected Poisson batch size B; the sample rate is q = B / n_train.
        steps: number of steps T; None = as many as the privacy budget allows (<= max_steps).
        max_steps: cap on T when it is derived from the budget.
        lr: primal step size eta_theta.
        optimizer: primal optimizer (momentum/Adam are post-processing of the noisy gradient).
        momentum: momentum coefficient for ``optimizer=momentum``.
        clip_norm: per-sample clipping norm C (None: no clipping, non-private methods).
        noise_multiplier: Gaussian sigma (std of the noise on the clipped sum / C).
        hist_noise_multiplier: Laplace scale b of the histogram (l1 sensitivity 1);
            the paper's ``b`` in ``Lap(1/b)`` is ``1 / hist_noise_multiplier``.
        calibrate_noise: with a fixed ``steps``, scale both noise multipliers to meet eps.
        lr_dual: dual step size eta_lambda.
        lambda_max: radius of the dual box Lambda = [0, lambda_max]^J.
        temperature: tau of the tempered softmax sigma_tau(z) = softmax(tau * z).
        dual: rates fed to the dual step: soft (tempered softmax) or hard (arg-max).
        sampling: ``independent`` (histogram and gradient on independent Poisson samples)
            or ``shared`` (one sample for both, paper Algorithm 1).
        denominator_floor: positive floor of the noisy subset counts (clamp_denominators).
        eval_every: evaluate on train/val/test every this many steps (and at the end).
        selection: ``best_feasible``: the evaluation with the highest validation accuracy
            among those whose hard train constraint holds (paper App. E.2); ``last``;
            ``random``: the iterate of a step drawn uniformly from 1..T before training (the
            output of the DP-DRO paper's Algorithms 2 and 3; data-independent, so free);
            ``average``: the mean of the checkpoints evaluated at steps >= T/2 (tail
            averaging of the iterates, which the convergence analyses of SGDA bound;
            post-processing, so free and without a selection release).
        micro_batch: rows per chunk of the per-sample gradient computation (memory bound;
            results do not depend on it).
        precision: ``auto`` (bf16 autocast for non-linear models on CUDA, fp32 elsewhere),
            ``fp32`` or ``bf16``; clipping norms, sums and noise are always fp32.
        secure_rng: draw the noise from the OS CSPRNG instead of the seeded torch PRNG
            (``privacy.secure_rng``; see :mod:`raco_cli.privacy.mechanisms`).
        scope: ``privacy.scope``. ``model``: evaluation records expose only test metrics and
            releases (noisy feasibility), and ``best_feasible`` selects privately;
            ``paper``: exact train feasibility and validation accuracy (paper App. E.2).
        selection_eps: epsilon of the private checkpoint selection (report-noisy-max on
            validation correct counts, :mod:`raco_cli.privacy.selection`); 0 = exact
            selection.  Set by ``privacy.selection_share * eps`` in ``scope=model``.
        preprocessing_noise: noise multiplier of the one Gaussian release of the DP
            standardisation (``dataset.preprocessing=dp``, :mod:`raco_cli.privacy.preprocessing`);
            0 = no such release.  Composed into the run's event by the planner.
        size_noise: noise multiplier (in rows) of the one Gaussian release of the training
            size, the DP count ``n + N(0, size_noise^2)`` (``privacy.size_noise_multiplier``,
            scope=model); 0 = the exact size is treated as public (scope=paper).
        train_size: the training size the run may use: q = B / train_size and every
            normaliser of a noisy sum (the released DP count under scope=model); None = the
            exact number of training rows (scope=paper, non-private methods).
        estimate_noise: noise multiplier of the one Gaussian release of a table's private
            bounds, level lists and missing-value indicators (``private`` values of
            ``dataset=table``, :mod:`raco_cli.privacy.estimates`); 0 = no such release.
        certificate_noise: noise multiplier of the one Gaussian release of the released
            model's validation prediction counts, its certificate (``constraint.confidence``
            under scope=model, ``privacy.certificate_noise_multiplier``,
            :mod:`raco_cli.privacy.certificate`); 0 = no such release.
        reserved_delta: the part of delta the thresholding of that release takes (its
            data-dependent levels); the accountant computes epsilon at ``delta - reserved_delta``
            (:meth:`accounting_delta`).
        options: method-specific extra keys (e.g. DP-FERMI's lambda).
        objective: the ``objective`` config group (``erm``, or the DRO objective of
            :mod:`raco_cli.objectives`).
    """

    name: str
    batch_size: int = UNSET
    steps: int | None = UNSET
    max_steps: int = UNSET
    lr: float = UNSET
    optimizer: Optimizer = UNSET
    momentum: float = UNSET
    clip_norm: float | None = UNSET
    noise_multiplier: float | None = UNSET
    hist_noise_multiplier: float | None = UNSET
    calibrate_noise: bool = UNSET
    lr_dual: float = UNSET
    lambda_max: float = UNSET
    temperature: float = UNSET
    dual: Dual = UNSET
    sampling: str = UNSET
    denominator_floor: float = UNSET
    eval_every: int = UNSET
    selection: Selection = UNSET
    micro_batch: int = UNSET
    secure_rng: bool = UNSET
    precision: str = "auto"
    scope: str = UNSET
    selection_eps: float = 0.0
    preprocessing_noise: float = 0.0
    size_noise: float = 0.0
    train_size: float | None = None
    estimate_noise: float = 0.0
    certificate_noise: float = 0.0
    reserved_delta: float = 0.0
    options: Mapping[str, Any] = UNSET
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)

    def size_of(self, n_rows: int) -> float:
        """The training size this run uses (:attr:`train_size`, else the exact ``n_rows``)."""
        return float(n_rows) if self.train_size is None else float(self.train_size)

    def accounting_delta(self, delta: float) -> float:
        """The delta at which the PLD accountant computes this run's epsilon: the run's delta
        less what the thresholding of a private level estimate reserved (:attr:`reserved_delta`)."""
        return float(delta) - self.reserved_delta

    def required(self, key: str) -> float:
        """A numeric setting a private method needs (the planner checked it is set)."""
        value = getattr(self, key)
        if value is None:
            raise ConfigError(f"method.{key} must be set for the private method {self.name} (got null).")
        return float(value)

    def _fill_defaults(self) -> None:
        """Set every :data:`UNSET` field from the packaged configs (class docstring)."""
        from raco_cli import defaults

        file = defaults.method_defaults(self.name)
        root = defaults.root_defaults()
        privacy = root.get("privacy") or {}
        if self.scope is UNSET:
            object.__setattr__(self, "scope", str(privacy.get("scope", "model")))
        if self.secure_rng is UNSET:
            object.__setattr__(self, "secure_rng", defaults.secure_rng(privacy.get("secure_rng", "auto"), self.scope))
        for key, fallback in UNSET_IN_FILE.items():
            if getattr(self, key) is not UNSET:
                continue
            value = file.get(key, fallback)
            if value == "auto":
                value = defaults.selection(value, self.scope) if key == "selection" else defaults.AUTO_PLACEHOLDERS[key]
            elif key in ("lr", "lr_dual", "lambda_max", "temperature", "denominator_floor", "momentum", "clip_norm", "noise_multiplier",
                         "hist_noise_multiplier") and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # (a YAML 4 is the float 4.0 the CLI reads)
            object.__setattr__(self, key, dict(value) if key == "options" else value)

    def __post_init__(self) -> None:
        self._fill_defaults()
        _positive_int("method.batch_size", self.batch_size, "the expected Poisson batch size.")
        if self.steps is not None:
            _positive_int("method.steps", self.steps, "the number of training steps (or null).")
        _positive_int("method.max_steps", self.max_steps, "the cap on steps derived from the budget.")
        _positive("method.lr", self.lr, "the primal learning rate.")
        _positive("method.lr_dual", self.lr_dual, "the dual learning rate.", allow_zero=True)
        _positive("method.lambda_max", self.lambda_max, "the bound of the multipliers.", allow_zero=True)
        _positive("method.temperature", self.temperature, "the softmax temperature tau.")
        _positive("method.denominator_floor", self.denominator_floor, "the floor of noisy counts.")
        _positive_int("method.eval_every", self.eval_every, "steps between evaluations.")
        _positive_int("method.micro_batch", self.micro_batch, "rows per gradient chunk.")
        for key, value, meaning in (
            ("method.clip_norm", self.clip_norm, "the per-sample clipping norm C."),
            ("method.noise_multiplier", self.noise_multiplier, "the Gaussian noise multiplier sigma."),
            ("method.hist_noise_multiplier", self.hist_noise_multiplier, "the Laplace scale b of the histogram."),
        ):
            if value is not None:
                _positive(key, value, meaning)
        check_noise("method.noise_multiplier", self.noise_multiplier)
        check_noise("method.hist_noise_multiplier", self.hist_noise_multiplier, laplace=True)
        if not isinstance(self.secure_rng, bool):
            raise ConfigError(f"privacy.secure_rng must be true or false (got privacy.secure_rng={self.secure_rng!r}); use a cryptographically secure noise source.")
        _choice("method.optimizer", self.optimizer, ("sgd", "momentum", "adam"), "the primal optimizer.")
        _choice("method.dual", self.dual, ("soft", "hard"), "the rates used by the dual step (raco_dp also takes auto: hard when a confidence margin applies).")
        _choice("method.sampling", self.sampling, ("independent", "shared"), "how histogram and gradient batches are drawn.")
        _choice("method.precision", self.precision, ("auto", "fp32", "bf16"), "the arithmetic of model forward/backward passes.")
        _choice("method.selection", self.selection, ("best_feasible", "last", "average", "random"),
                "the reported checkpoint rule (or auto: average under privacy.scope=model, best_feasible under paper).")
        _choice("privacy.scope", self.scope, SCOPES, "model: eps covers the model and every record; paper: the paper's protocol.")
        _positive("privacy.selection_eps", self.selection_eps, "the epsilon of the private checkpoint choice.", allow_zero=True)
        _positive("dataset.dp_noise_multiplier", self.preprocessing_noise, "the noise multiplier of the DP standardisation.",
                  allow_zero=True)
        _positive("dataset.estimate_noise_multiplier", self.estimate_noise, "the noise multiplier of the private estimates.",
                  allow_zero=True)
        if not 0 <= self.momentum < 1:
            raise ConfigError(IN_RANGE.format(key="method.momentum", interval="[0, 1)", value=self.momentum, meaning="the momentum coefficient."))


def _positive(key: str, value: object, meaning: str, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ConfigError(f"{key} must be a finite number (got {key}={value!r}); {meaning}")
    if value < 0 or (value == 0 and not allow_zero):
        template = NON_NEGATIVE if allow_zero else POSITIVE
        raise ConfigError(template.format(key=key, value=value, meaning=meaning))


def _positive_int(key: str, value: object, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer (got {key}={value!r}); {meaning}")
    if value <= 0:
        raise ConfigError(POSITIVE.format(key=key, value=value, meaning=meaning))


def _choice(key: str, value: object, choices: tuple[str, ...], meaning: str) -> None:
    if value not in choices:
        raise ConfigError(CHOICE.format(key=key, choices=", ".join(choices), value=value, meaning=meaning))


@dataclass(frozen=True)
class Seeds:
    """Independent seeds of one run, all derived from the run seed and logged.

    Attributes:
        seed: the run seed (``seed=``).
        init: model initialisation.
        sampling: Poisson sampling generator.
        noise: Laplace/Gaussian noise generator.
        selection: Gumbel noise of the private checkpoint selection (``scope=model``); its
            own stream, so training noise is the same in both scopes.
        preprocessing: Gaussian noise of the DP standardisation (``dataset.preprocessing=dp``).
        size: Gaussian noise of the DP count of the training rows (``privacy.scope=model``).
        estimates: Gaussian noise of a table's private estimates (``private`` values of
            ``dataset=table``, :mod:`raco_cli.privacy.estimates`).
        certificate: Gaussian noise of the released model's certificate
            (:mod:`raco_cli.privacy.certificate`).
    """

    seed: int
    init: int
    sampling: int
    noise: int
    selection: int = 0
    preprocessing: int = 0
    size: int = 0
    estimates: int = 0
    certificate: int = 0

    @classmethod
    def from_seed(cls, seed: int) -> Seeds:
        # spawn(8)[:7] == spawn(7): adding a seed leaves the earlier ones unchanged
        init, sampling, noise, selection, preprocessing, size, estimates, certificate = (
            int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(8)
        )
        return cls(seed=seed, init=init, sampling=sampling, noise=noise, selection=selection, preprocessing=preprocessing,
                   size=size, estimates=estimates, certificate=certificate)


@dataclass
class EvalRecord:
    """Metrics of one evaluation: ``metrics[split][name]`` and the step."""

    step: int
    metrics: dict[str, dict[str, Any]]
    lam: list[float]


@dataclass
class TrainResult:
    """What a method returns; the caller logs it.

    Attributes:
        history: every evaluation, in order.
        selected: index into history of the reported checkpoint.
        steps: steps actually run.
        lam: final multipliers.
        state_dict: model parameters of the selected checkpoint.
        stats: run statistics (mean batch size, time per step, clip fraction, ...).
        releases: per-step release counts by kind (for the contract tests: every
            data-touching release must be in the accounted event tree).
    """

    history: list[EvalRecord]
    selected: int
    steps: int
    lam: list[float]
    state_dict: dict[str, Any]
    stats: dict[str, Any] = field(default_factory=dict)
    releases: dict[str, int] = field(default_factory=dict)

    @property
    def selected_record(self) -> EvalRecord:
        return self.history[self.selected]


class Reporter(Protocol):
    """Where a method reports progress; tracking/ and the CLI implement it."""

    def on_step(self, step: int, total: int, values: Mapping[str, float]) -> None: ...

    def on_eval(self, record: EvalRecord) -> None: ...


class NullReporter:
    """A reporter that drops everything (tests, library use)."""

    def on_step(self, step: int, total: int, values: Mapping[str, float]) -> None:
        pass

    def on_eval(self, record: EvalRecord) -> None:
        pass


def select_checkpoint(history: list[EvalRecord], rule: Selection) -> tuple[int, bool]:
    """Index of the reported evaluation and whether it satisfies the train constraint.

    ``best_feasible``: highest validation accuracy among evaluations whose hard train
    constraint holds; if none holds, the last one, flagged unsatisfied (paper App. E.2).
    A regression record (``mspe``, no constraint) ranks by the lowest validation MSPE.
    """
    if not history:
        raise ValueError("no evaluation recorded")
    if rule == "random":  # the random iterate is drawn and kept by the methods that support it
        raise ValueError("selection=random is resolved by the method (raco_cli.methods.dro.common), not here")
    if rule == "last":
        i = len(history) - 1
        return i, bool(history[i].metrics["train"]["satisfied"])
    feasible = [i for i, r in enumerate(history) if r.metrics["train"]["satisfied"]]
    if not feasible:
        return len(history) - 1, False
    best = max(feasible, key=lambda i: (_validation_score(history[i].metrics["val"]), i))
    return best, True


def _validation_score(val: Mapping[str, Any]) -> float:
    """Higher is better: validation accuracy, or minus the validation MSPE (regression)."""
    if "mspe" in val:
        return -float(val["mspe"]) if np.isfinite(val["mspe"]) else -np.inf
    return float(val["accuracy"])


def read_options(spec: MethodSpec, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``spec.options`` merged over a method's defaults; unknown keys and non-numbers for
    numeric defaults are rejected with one line naming the key.

    >>> read_options(MethodSpec(name="m", options={"lam": 2}), {"lam": 1.0, "mode": "a"})
    {'lam': 2.0, 'mode': 'a'}
    """
    out = dict(defaults)
    for key, value in spec.options.items():
        if key not in defaults:
            raise ConfigError(
                f"Unknown key method.options.{key} for method {spec.name}. Allowed: {', '.join(sorted(defaults))}."
            )
        default = defaults[key]
        if isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise ConfigError(f"method.options.{key} must be a finite number (got method.options.{key}={value!r}).")
            value = float(value)
        out[key] = value
    return out
