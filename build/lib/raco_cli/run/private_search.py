"""``raco tune`` under ``privacy.scope=model``: a private random search whose released model keeps
one accounted eps for the whole search (Papernot & Steinke, ICLR 2022; accounting in
:mod:`raco_cli.privacy.tuning`).

1. **Releases made once** (:func:`raco_cli.run.prepare.release_inputs`): n~ or the constraint's
   cell counts, the DP standardisation, a table's private estimates.  Every trial plans from
   them; they are composed once with the search.
2. **Candidates** (post-processing of the configuration and those releases): the configuration
   as given, and ``tune.candidates - 1`` local settings drawn from the OS CSPRNG: each
   searched value of the configuration, as resolved for the data (an auto batch size from n~;
   an auto dual step stays auto, resolved per candidate), times a log-uniform factor
   (:data:`raco_cli.run.tune_space.LOCAL_RANGE`).
3. **Plan**: the largest per-trial eps whose whole search stays within ``eps``.  A trial draws one
   candidate uniformly, so its RDP curve is at most the pointwise max over the candidates of
   [the training run planned at that eps + the score release]; the search's curve follows from
   the repetition theorem, the releases of step 1 are added, and the sum is converted at delta.
4. **Trials**: K ~ ``tune.repetitions`` and each trial's candidate and seed are drawn from the OS
   CSPRNG (:class:`raco_cli.privacy.csprng.SecureDraws`, never written; not a PRNG seeded from
   it, whose state the released trial's seed would help reconstruct).  A trial is a ``scope=model`` training
   run (secure noise) and its score, ``(correct, rows) + N(0, s^2 I)`` on the validation split
   (``tune.score_noise`` = s rows; L2 sensitivity sqrt(2) under add/remove of a validation
   record: ``GaussianDpEvent(s / sqrt(2))``), and its noisy feasibility (post-processing of its
   noisy histograms).  Trials are ranked by (noisy-feasible, noisy correct count); when none is
   noisy-feasible, the one of least noisy violation is released, with ``search.noisy_feasible: false``.
5. **Output**: only the best trial, written as a run (summary.json, model.pt, MLflow), its
   ``eps_spent`` the search's.  K, the other trials and their scores are never written or
   printed: the theorems bound the best alone (a released K reduces the search to a fixed
   number of repetitions).  Nor is its duration: under ``scope=model`` no record carries
   process timing (docs/privacy.md, "Timing"), and the released run is named by a random id,
   not by its trial's seed.

The configurations come from the command line (:class:`SearchConfigs`, composed by Hydra in
:mod:`raco_cli.cli.tune_private`): the search chooses the candidates' overrides, the command line
composes them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from raco_cli.errors import ConfigError, RacoError
from raco_cli.run.tune_space import LOCAL_RANGE, default_study, local_overrides, space_of

PROTOCOL = "private (Papernot & Steinke 2022)"


class SearchConfigs(Protocol):
    """The job configs of a search, as plain dicts: the configuration as given and each trial's."""

    def given(self) -> Mapping[str, Any]:
        """The configuration as given, validated (bad overrides: one line, before any release)."""
        ...

    def trial(self, candidate: Sequence[str], eps: float, seed: int, *, experiment: str) -> Mapping[str, Any]:
        """The configuration with a candidate's overrides, at ``eps`` and ``seed``; its runs go to the
        MLflow experiment ``experiment`` unless the configuration's overrides name one."""
        ...


@dataclass(frozen=True)
class SearchOptions:
    repetitions: Any  # raco_cli.privacy.tuning.Repetitions
    candidates: int
    score_noise: float
    study: str | None


def secure_draws() -> Any:
    """The source of the search's secret draws (K, the candidates, each trial's candidate and
    seed): the OS CSPRNG.  Tests replace this function to follow the draws (the explicit hook;
    ``tune.sampler_seed`` is an option of ``privacy.scope=paper`` only)."""
    from raco_cli.privacy.csprng import SecureDraws

    return SecureDraws()


@dataclass
class Trial:
    """One trial's outputs: its model (in ``prep.model``), training result and noisy score."""

    overrides: list[str]
    prep: Any
    result: Any
    noisy_correct: float
    noisy_rows: float
    feasible: bool
    excess: float = 0.0  # noisy violation beyond the target (<= 0 when feasible): post-processing of its histograms

    @property
    def rank(self) -> tuple[bool, float]:
        """Noisy-feasible trials first, by noisy correct count; when none is, the one closest to
        its target (the most accurate of unfair trials would be the least fair one)."""
        return (True, self.noisy_correct) if self.feasible else (False, -self.excess)


def draw_candidates(method: str, n: int, rng: Any, values: Mapping[str, Any], n_train: float,
                    objective: str = "erm") -> list[list[str]]:
    """``n`` local candidates: each searched value of the method times a log-uniform factor
    (``raco_cli.run.tune_space.LOCAL_RANGE``), as config overrides.  ``values`` are the
    configuration's own values as resolved for the data and ``n_train`` the released n~: a
    function of the configuration and accounted releases only (post-processing).  ``rng``: the
    source of the factors (the search's :func:`secure_draws`), or an int seeding numpy (tests).

    >>> draw_candidates("dp_sgd", 2, 0, {"noise_multiplier": 3.0, "lr": 4.0, "batch_size": 256}, 4000)[0][0]
    'method.noise_multiplier=3.352'
    """
    names = [name for name in space_of(method, objective) if _number(values.get(name))]
    if isinstance(rng, (int, np.integer)):
        rng = np.random.default_rng(int(rng))
    out = []
    for _ in range(n):
        factors = {name: math.exp(rng.uniform(*np.log(LOCAL_RANGE[name]))) for name in names}
        out.append(local_overrides(values, factors, n_train))
    return out


def searched_values(prep: Any) -> dict[str, Any]:
    """The values a local candidate scales: the configuration's method spec as planned (an auto
    batch size resolved from n~), by the search space's names.  ``method.lr_dual=auto`` is not
    searched: it is resolved per candidate from its own plan (batch size, steps, noise), which a
    fixed value scaled from another plan is not (Adult, batches of 146-186 with the dual step of
    batch 1 024: test DP gap 0.07-0.09 against gamma 0.05 in 3 of 7 searches)."""
    spec = prep.plan.spec
    lr_dual = None if prep.spec.auto_lr_dual else spec.lr_dual
    return {"noise_multiplier": spec.noise_multiplier, "laplace_b": spec.hist_noise_multiplier, "lr": spec.lr,
            "lr_dual": lr_dual, "batch_size": spec.batch_size, "temperature": spec.temperature,
            "lam": spec.options.get("lam"), "lr_dual_dro": lr_dual, "steps": spec.steps, "phase": spec.options.get("phase"),
            "clip_norm": spec.clip_norm, "diff_clip_scale": spec.options.get("diff_clip_scale")}


def _number(value: Any) -> bool:
    """A value a local factor can scale (not None, ``auto`` or ``full``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def study_name(spec: Any) -> str:
    """The default name of a private search (its output folder and MLflow experiment ``tune-<name>``)."""
    # the dataset as its runs name it: a table's own name (dataset.options.name, else its file's stem), not "table"
    return "private-" + default_study(spec.method.name, spec.dataset.display, spec.constraint.name, spec.eps, spec.constraint.gamma)


@contextlib.contextmanager
def _quiet(level: int = logging.WARNING) -> Iterator[None]:
    """Planning composes many candidate runs and the trials train many: their per-run log lines
    are not the search's (and per-trial lines would count the trials)."""
    logger = logging.getLogger("raco_cli")
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def score_event(score_noise: float) -> Any:
    """The event of a trial's score: ``(correct, rows) + N(0, s^2 I)``, L2 sensitivity sqrt(2)."""
    import dp_accounting as dpa

    return dpa.GaussianDpEvent(score_noise / math.sqrt(2.0))


class PrivateSearch:
    """Steps 1-3 at construction (step 3 in :meth:`plan`), step 4 in :meth:`run`, step 5 in :meth:`write`."""

    def __init__(self, opts: SearchOptions, configs: SearchConfigs) -> None:
        from raco_cli import methods
        from raco_cli.methods.base import Seeds
        from raco_cli.methods.planning import once_events
        from raco_cli.run.prepare import release_inputs
        from raco_cli.run.spec import build_run_spec

        self.opts, self.configs = opts, configs
        self.spec = build_run_spec(configs.given())  # bad overrides: one line, before any release
        self.study = opts.study or study_name(self.spec)
        self.method = methods.get(self.spec.method.name)
        if not self.method.PRIVATE:
            raise ConfigError(f"privacy.scope=model tuning needs a private method (got method={self.spec.method.name}); "
                              "tune a non-private method with privacy.scope=paper.")
        # step 1: the releases every trial shares, made once (secure noise under scope=model)
        self.released = release_inputs(self.spec, self.method, Seeds.from_seed(self.spec.seed))
        self.before = once_events(self.released.method_spec)
        self.delta = self.released.method_spec.accounting_delta(self.spec.delta)
        with _quiet(logging.ERROR):  # the configuration as given must plan as one run at eps (its errors are the user's)
            given = self._prepare([], float(self.spec.eps))
        # step 2: candidate 0 is the configuration as given (e.g. the shipped defaults); the others
        # scale its values as resolved from the releases (an auto batch size from n~)
        from raco_cli.privacy import releases

        n_train = given.plan.spec.size_of(len(np.asarray(given.data.splits["train"])))
        values = searched_values(given)
        # drawn from the CSPRNG; not a function of the data, but on the release tape so that a
        # replay (tests/e2e/test_replay.py) plans the same search
        self.candidates = [[], *releases.release("tune_candidates", lambda: draw_candidates(
            self.spec.method.name, opts.candidates - 1, secure_draws(), values, n_train, self.spec.method.objective.name))]
        self.eps_trial, self.eps_spent, self.trial_events = self.plan()
        self.usable = sorted(self.trial_events)

    # -- step 3 -------------------------------------------------------------------------------
    def _trial_config(self, candidate: Sequence[str], eps: float, seed: int) -> Mapping[str, Any]:
        """The candidate's job config at ``eps`` and ``seed`` (planning asks for each candidate at
        every bisection point), its runs in the search's MLflow experiment ``tune-<study>``."""
        return self.configs.trial(candidate, eps, seed, experiment=f"tune-{self.study}")

    def _prepare(self, candidate: Sequence[str], eps: float, seed: int = 0) -> Any:
        from raco_cli.run.prepare import prepare_run

        return prepare_run(self._trial_config(candidate, eps, seed), released=self.released)

    def trial_event(self, plan_event: Any) -> Any:
        """The event of one trial: its training run's plan, then its score release."""
        import dp_accounting as dpa

        return dpa.ComposedDpEvent([plan_event, score_event(self.opts.score_noise)])

    def _events(self, eps: float) -> dict[int, Any]:
        """Candidate index -> its trial's event (training at ``eps`` + score) for the candidates
        planned for at least ``FEW_STEPS`` noisy steps at ``eps`` (fewer is too few to learn: a run
        warns), or, when none is, for those that take a step at all.  The steps are planned from
        the configuration and n~: the choice reads no data."""
        from raco_cli.run.prepare import FEW_STEPS

        out, steps = {}, {}
        with _quiet(logging.ERROR):
            for i, candidate in enumerate(self.candidates):
                try:
                    prep = self._prepare(candidate, eps)
                except RacoError:  # a budget too small for one step
                    continue
                out[i], steps[i] = self.trial_event(prep.plan.event), prep.plan.steps
        enough = {i: e for i, e in out.items() if steps[i] >= FEW_STEPS}
        return enough or out

    def search_epsilon(self, events: Mapping[int, Any]) -> float:
        """eps at delta of the search whose trial draws among ``events`` (module doc, step 3)."""
        import dp_accounting as dpa

        from raco_cli.privacy.accountant import step_pld
        from raco_cli.privacy.rdp import ORDERS, check_supported, rdp_curve
        from raco_cli.privacy.tuning import search_epsilon, trial_curve

        if not events:
            return math.inf
        for event in events.values():
            why = check_supported(event)
            if why is not None:
                raise ConfigError(f"privacy.scope=model tuning needs an RDP curve of every trial: {why}. "
                                  "Use method.sampling=independent.")
        curve = trial_curve([rdp_curve(e) for e in events.values()])
        before = rdp_curve(dpa.ComposedDpEvent(list(self.before))) if self.before else None
        trial_delta = None
        if self.opts.repetitions.kind == "poisson":  # Theorem 6's delta_hat, off each candidate's PLD
            plds = [step_pld(e, discretization=self.spec.discretization) for e in events.values()]

            def trial_delta(eps_hat: np.ndarray) -> np.ndarray:  # a non-private trial (no PLD): delta 1
                eps_hat = np.asarray(eps_hat, dtype=float)
                order = np.argsort(eps_hat)  # dp-accounting's vectorised hockey stick takes ascending eps
                out = np.zeros_like(eps_hat)
                for p in plds:
                    delta = np.ones_like(eps_hat)
                    if p is not None:
                        delta[order] = p.get_delta_for_epsilon(eps_hat[order])
                    out = np.maximum(out, delta)
                return out

        return search_epsilon(curve, self.opts.repetitions, self.delta, orders=ORDERS, trial_delta=trial_delta,
                              before_rdp=before)

    def plan(self) -> tuple[float, float, dict[int, Any]]:
        """(per-trial eps, the search's eps, the usable candidates' trial events): the largest per-trial eps
        whose search stays within ``eps`` (bisection, :func:`raco_cli.privacy.tuning.plan_trial_epsilon`)."""
        from raco_cli.errors import PrivacyBudgetError
        from raco_cli.privacy.tuning import plan_trial_epsilon

        total = float(self.spec.eps)
        cache: dict[float, tuple[float, dict[int, Any]]] = {}

        def at(eps: float) -> float:
            if eps not in cache:
                events = self._events(eps)
                cache[eps] = (self.search_epsilon(events), events)
            return cache[eps][0]

        try:
            eps_trial = plan_trial_epsilon(total, at, smallest=1e-3, rel_tol=0.01)
        except ValueError:
            raise PrivacyBudgetError(
                f"eps={total:g} is too small for a private search of {self.opts.repetitions.describe()}: no per-trial eps "
                f"down to {total / 1000:.3g} keeps it within eps (or no candidate takes a step there). Use a larger eps, a "
                "smaller tune.mean, or privacy.scope=paper."
            ) from None
        spent, events = cache[eps_trial]
        return eps_trial, spent, events

    # -- step 4 -------------------------------------------------------------------------------
    def _score(self, prep: Any, source: Any) -> tuple[float, float]:
        """``(correct, rows) + N(0, s^2 I)`` on the validation split, with the trial's secure noise."""
        import torch

        from raco_cli.methods.gradients import engine_for
        from raco_cli.methods.training import predict_logits
        from raco_cli.privacy import releases
        from raco_cli.privacy.mechanisms import gaussian_noise

        data = prep.data
        idx = np.asarray(data.splits["val"])

        def noisy() -> tuple[float, float]:
            logits = predict_logits(engine_for(prep.model, micro_batch=prep.plan.spec.micro_batch), data, idx, prep.device)
            correct = float(np.sum(np.argmax(logits, axis=1) == data.y[idx]))
            noise = gaussian_noise((2,), self.opts.score_noise, source, dtype=torch.float64).cpu().numpy()
            return correct + float(noise[0]), float(len(idx)) + float(noise[1])

        return releases.release("tune_score", noisy)

    def _trial(self, index: int, seed: int) -> Trial:
        from raco_cli.methods.base import NullReporter
        from raco_cli.privacy.mechanisms import noise_source

        candidate = self.candidates[index]
        with _quiet(logging.ERROR):  # nothing per trial, warnings included: they would count the trials
            prep = self._prepare(candidate, self.eps_trial, seed)
            pplan = prep.plan
            if repr(self.trial_event(pplan.event)) != repr(self.trial_events[index]):
                raise RuntimeError(f"trial of candidate {index} planned {pplan.event}, not the event the search accounted")
            result = self.method.fit(prep.data, prep.model, prep.constraints, pplan.spec, steps=pplan.steps, seeds=prep.seeds,
                                     device=prep.device, reporter=NullReporter())
        release = result.selected_record.metrics.get("release") or {}
        violation = release.get("noisy_violation")
        # noisy-feasible: the noisy training rates meet the gamma asked for (a run under a margin
        # trains against gamma - m; its noisy violation is measured against that target)
        slack = float(np.min(prep.margins.margin)) if prep.margins is not None else 0.0
        excess = 0.0 if violation is None else float(violation) - slack
        correct, rows = self._score(prep, noise_source(0, "cpu", secure=True))  # os.urandom: no seed
        return Trial(candidate, prep, result, correct, rows, excess <= 0.0, excess)

    def run(self) -> Trial | None:
        """Draw K and run the trials; the best by :attr:`Trial.rank`, None when
        K = 0 (Poisson).  Prints nothing per trial."""
        from raco_cli.privacy import releases
        from raco_cli.privacy.tuning import draw_repetitions

        def draw() -> list[tuple[int, int]]:
            rng = secure_draws()  # the OS CSPRNG, never written
            k = draw_repetitions(self.opts.repetitions, rng)
            return [(self.usable[int(rng.integers(len(self.usable)))], int(rng.integers(2**31 - 1))) for _ in range(k)]

        # (candidate, seed) of each trial: not a function of the data, but on the release tape so
        # that a replay (tests/e2e/test_replay.py) redraws the same search
        best: Trial | None = None
        for index, seed in releases.release("tune_draws", draw):
            trial = self._trial(index, seed=seed)
            if best is None or trial.rank > best.rank:
                best = trial
        return best

    # -- step 5 -------------------------------------------------------------------------------
    def record(self, best: Trial) -> dict[str, Any]:
        """The search block of the best run's summary (``search``) and what it overrides."""
        reps = self.opts.repetitions
        return {
            "eps_target": float(self.spec.eps),
            "eps_spent": float(self.eps_spent),
            "event": self.event_text(best),
            "tuned_on": self.tuned_on(best),
            "search": {
                "protocol": PROTOCOL, "eps_covers": "the search", "repetitions": reps.kind, "mean": reps.mean,
                "shape": reps.shape if reps.kind == "truncated_negative_binomial" else None,
                "candidates": len(self.candidates), "usable_candidates": len(self.usable),
                "eps_trial": float(self.eps_trial), "score_noise": self.opts.score_noise,
                "noisy_val_correct": best.noisy_correct, "noisy_val_rows": best.noisy_rows,
                "noisy_val_accuracy": best.noisy_correct / max(best.noisy_rows, 1.0), "noisy_feasible": best.feasible,
            },
        }

    def tuned_on(self, best: Trial) -> dict[str, Any]:
        """Where the released settings come from: the search, and for the keys it did not set, the
        configuration's own ``method.tuned_on`` (values tuned non-privately on this very dataset
        stay ``outside_eps``: the search's eps does not cover how they were chosen)."""
        from raco_cli.run.finish import tuned_on

        given = tuned_on(best.prep.spec)
        return {"dataset": self.spec.dataset.name, "split": f"train/val of dataset.split_seed {self.spec.dataset.split_seed}",
                "protocol": PROTOCOL, "searched": sorted(o.split("=", 1)[0] for o in best.overrides),
                "others": given, "outside_eps": bool(given and given.get("outside_eps"))}

    def event_text(self, best: Trial) -> str:
        """What the search's eps accounts: the releases made once, then the best of K trials."""
        trial = self.trial_event(best.prep.plan.event)
        return (f"ComposedDpEvent([{', '.join(map(str, self.before))}{', ' if self.before else ''}"
                f"RepeatAndSelect({self.opts.repetitions.describe()}; trial eps {self.eps_trial:.4g}; the trial drawn among "
                f"{len(self.usable)} candidates, this one: {trial})])")

    def write(self, best: Trial, run_dir: Path) -> dict[str, Any]:
        """The best trial as a run: its outputs and MLflow records, eps_spent the search's."""
        from raco_cli.run.finish import finish_run
        from raco_cli.run.records import open_recorder
        from raco_cli.run.train import draw_curves

        # named by a random id: a trial's seed (a CSPRNG draw of the search) names no record
        name = f"{best.prep.spec.method.name}-{best.prep.spec.dataset.display}-{self.study}-best-{secrets.token_hex(4)}"
        recorder = open_recorder(best.prep, run_dir, None, run_name=name, search_trial=True)
        status = "FAILED"
        try:
            summary = finish_run(best.prep, best.result, run_dir, recorder, started=None,
                                 curves=draw_curves(best.prep.spec, None), search=self.record(best))
            if recorder is not None:
                recorder.set_tags({"raco.tune.protocol": PROTOCOL, "raco.tune.eps_covers": "the search",  # raco report's price line
                                   "raco.tune.eps_target": f"{float(self.spec.eps):g}", "raco.tune.eps_trial": f"{self.eps_trial:.6g}",
                                   "raco.tune.repetitions": self.opts.repetitions.describe(),
                                   "raco.tune.candidates": str(len(self.candidates))})
            status = "FINISHED"
            return summary
        finally:
            if recorder is not None:
                recorder.finish(status)
