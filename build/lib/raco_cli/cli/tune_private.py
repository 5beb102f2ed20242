"""``raco tune`` under ``privacy.scope=model``: the command-line side of the private search.

The search itself (plan, trials, the best trial written as a run) is the run layer's
(:mod:`raco_cli.run.private_search`); here Hydra composes its configurations
(:class:`HydraSearchConfigs`), and the command claims the search's own directory
(:mod:`raco_cli.cli.tune_dirs`), prints what it may and writes ``best.yaml``
(:mod:`raco_cli.cli.tune_best`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raco_cli.errors import RacoError


class HydraSearchConfigs:
    """A search's configurations, composed by Hydra from the command line's overrides (the run
    layer's :class:`~raco_cli.run.private_search.SearchConfigs`)."""

    def __init__(self, overrides: Sequence[str]) -> None:
        self.overrides = list(overrides)
        self._composed: dict[tuple[str, ...], Any] = {}  # candidate -> its composed job config (job)

    def given(self) -> dict[str, Any]:
        from raco_cli.cli.job_config import plain_job
        from raco_cli.cli.validate import compose_config

        return plain_job(compose_config(self.overrides))  # bad overrides: one line, before any release

    def trial(self, candidate: Sequence[str], eps: float, seed: int, *, experiment: str) -> dict[str, Any]:
        from raco_cli.cli.job_config import plain_job

        return plain_job(self.job(candidate, eps, seed, experiment=experiment))

    def job(self, candidate: Sequence[str], eps: float, seed: int, *, experiment: str) -> Any:
        """:meth:`trial` as a ``DictConfig``: composed by Hydra once per candidate, then copied with
        ``eps`` and ``seed`` set (planning asks for each candidate at every bisection point;
        ``test_a_trial_config_is_the_composed_one`` checks the copy equals a fresh compose)."""
        from omegaconf import open_dict

        from raco_cli.cli.validate import compose_job

        key = tuple(candidate)
        if key not in self._composed:
            named = [] if any(o.lstrip("+").startswith("tracking.experiment=") for o in self.overrides) \
                else [f"tracking.experiment={experiment}"]
            self._composed[key] = compose_job([*self.overrides, *named, *candidate])
        cfg = copy.deepcopy(self._composed[key])
        with open_dict(cfg):
            cfg.eps, cfg.seed = float(eps), int(seed)
        return cfg


def private_main(opts: Mapping[str, Any], overrides: list[str]) -> int:
    """The private search (privacy.scope=model): plan, trials, the best trial written as a run."""
    from raco_cli.cli.result_table import print_result
    from raco_cli.cli.tune_best import write_best_private
    from raco_cli.cli.tune_dirs import check_free, claim, run_dir_override
    from raco_cli.privacy.tuning import Repetitions
    from raco_cli.run.private_search import PrivateSearch, SearchOptions

    fixed_dir = run_dir_override(overrides)
    if fixed_dir is not None:  # before the planning: a taken directory is a one-line error, not a lost search
        check_free(fixed_dir)
    reps = Repetitions(str(opts["repetitions"]), float(opts["mean"]), float(opts["shape"]))  # type: ignore[arg-type]
    search_opts = SearchOptions(repetitions=reps, candidates=int(opts["candidates"]), score_noise=float(opts["score_noise"]),
                                study=opts["study"])
    print(f"private search ({reps.describe()}) over {search_opts.candidates} candidates: planning the per-trial budget ...")
    search = PrivateSearch(search_opts, HydraSearchConfigs(overrides))
    study_name = search.study
    print(f"eps {search.spec.eps:g} covers the search: per-trial eps {search.eps_trial:.4g}, search eps {search.eps_spent:.4f} "
          f"(delta {search.spec.delta:.3g}); {len(search.usable)} of {search_opts.candidates} candidates fit the trial budget")
    print("running the trials (their number and scores stay secret: only the best trial is released) ...")
    best = search.run()
    if best is None:
        raise RacoError("The private search drew no trial (K = 0 under tune.repetitions=poisson); the release is empty. "
                        "Run it again or use tune.repetitions=truncated_negative_binomial (K >= 1).")
    if not best.feasible:  # released as raco train releases a run its histograms call unsatisfied: the test line says more
        print(f"warning: no trial of the private search met constraint.gamma={search.spec.constraint.gamma:g} on its noisy "
              "training histograms; released the one closest to it (search.noisy_feasible: false). A larger eps, a looser "
              "constraint.gamma or more data would help.")
    search_dir = claim(Path(str(opts["out"])), study_name, fixed_dir)  # its own directory: never another search's
    run_dir = search_dir / "best"
    summary = search.write(best, run_dir)
    path = write_best_private(best, search, study_name=study_name, overrides=overrides, out=search_dir)
    print_result(summary, run_dir)  # raco train's table: the released model's test fairness rows, eps, where it is
    print(f"  best trial settings  {' '.join(best.overrides) or 'the configuration as given'} (as an experiment config: {path})")
    return 0
