"""The raco sweeper's job planning, and every sweep file of the paper's figures."""

from __future__ import annotations

import pytest
import yaml

from raco_cli.cli.paths import SWEEPS_DIR
from raco_cli.cli.sweep_plan import expand, grid_overrides, plan_jobs
from raco_cli.errors import ConfigError

GRIDS = {
    "raco_dp": {"method": "raco_dp", "eps": "0.5,1", "constraint.gamma": "0.02,0.05,0.1", "seed": "range(0,3)"},
    "dp_fermi": {"method": "dp_fermi", "eps": "0.5,1", "++method.options.lam": [0, 2], "seed": "range(0,3)"},
    "sgda": {"method": "sgda", "constraint.gamma": "0.02,0.05,0.1", "seed": "range(0,3)"},
}
SMOKE = {"seed": "range(0,2)", "constraint.gamma": "0.05", "++method.options.lam": 2}


def test_expand_is_the_cartesian_product():
    jobs = expand(["a=1,2", "b=x", "c=range(0,3)"])
    assert len(jobs) == 6 and jobs[0] == ["a=1", "b=x", "c=0"] and jobs[-1] == ["a=2", "b=x", "c=2"]


def test_union_of_grids_in_file_order():
    jobs = plan_jobs(GRIDS, None, [])
    assert [name for name, _ in jobs] == ["raco_dp"] * 18 + ["dp_fermi"] * 12 + ["sgda"] * 9
    assert ["method=dp_fermi", "eps=0.5", "++method.options.lam=0", "seed=0"] in [j for _, j in jobs]


def test_command_line_replaces_the_grid_axis_and_adds_keys():
    jobs = plan_jobs(GRIDS, None, ["seed=7", "method.lr=2"], only=["sgda"])
    assert len(jobs) == 3
    assert all(j[-2:] == ["seed=7", "method.lr=2"] for _, j in jobs)
    # a prefixed key still replaces its axis
    assert grid_overrides({"++method.options.lam": "0,1"}, ["method.options.lam=4"]) == ["method.options.lam=4"]


def test_smoke_replaces_only_axes_a_grid_has_and_adds_overrides():
    jobs = plan_jobs(GRIDS, None, [], smoke=True, smoke_params=SMOKE, smoke_overrides={"method.max_steps": 20})
    by = {}
    for name, job in jobs:
        by.setdefault(name, []).append(job)
    assert [len(by[g]) for g in ("raco_dp", "dp_fermi", "sgda")] == [4, 4, 2]
    assert all("method.max_steps=20" in j for js in by.values() for j in js)
    assert not any(k.startswith("constraint.gamma") for j in by["dp_fermi"] for k in j)  # no axis added


def test_only_selects_grids_and_unknown_is_one_line():
    assert {n for n, _ in plan_jobs(GRIDS, None, [], only=["sgda", "raco_dp"])} == {"sgda", "raco_dp"}
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.only names unknown grid\(s\) nope. Available: raco_dp, dp_fermi, sgda.$"):
        plan_jobs(GRIDS, None, [], only=["nope"])


def test_without_grids_it_is_the_basic_sweeper():
    jobs = plan_jobs(None, {"eps": "1,2"}, ["seed=0,1"])
    assert [j for _, j in jobs] == [["eps=1", "seed=0"], ["eps=1", "seed=1"], ["eps=2", "seed=0"], ["eps=2", "seed=1"]]


SWEEPS = sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))
EXPECTED = {"fig2a_celeba", "fig2b_adult", "fig2c_acs", "fig3_satisfiability", "fig4_adult", "fig4_credit",
            "fig4_parkinsons", "fig5_adult", "fig5_heart", "fig6_credit", "fig7_acs", "fig8a_clipping",
            "fig8b_hard_soft", "fig9_low_eps", "table2_timing",
            "dpse_table1", "dpse_table2", "dpse_table3", "dpse_fig2",  # DPSE paper: docs/dpse.md
            "dro_table3", "dro_table2_mia", "dro_noise"}  # fmt: skip  (DP-DRO paper: docs/dro.md)


def test_every_figure_has_a_sweep_and_a_figure_spec():
    from raco_cli.figures.specs import FIGURES

    assert set(SWEEPS) == EXPECTED
    assert {f.sweep for f in FIGURES.values()} <= set(SWEEPS)


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_file_plans_and_smoke_is_small(name):
    sweep = yaml.safe_load((SWEEPS_DIR / f"{name}.yaml").read_text())
    assert sweep["tracking"]["experiment"], name
    sw = sweep["hydra"]["sweeper"]
    full = plan_jobs(sw["grids"], None, [])
    smoke = plan_jobs(sw["grids"], None, [], smoke=True, smoke_params=sw.get("smoke_params"),
                      smoke_overrides=sw.get("smoke_overrides"))
    assert 0 < len(smoke) < len(full) and len(smoke) <= 100, (name, len(smoke), len(full))


@pytest.mark.slow  # 8-16 s per sweep: each eps of a calibrated grid is an accountant search
@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_file_composes_and_validates_every_axis_value(name):
    from raco_cli.cli.validate import prevalidate

    prevalidate([f"+sweep={name}"])
    prevalidate([f"+sweep={name}", "hydra.sweeper.smoke=true"])


def test_fig4_adult_grid_sizes():
    """The full Fig. 4a grid (SPEC section 6): 4 eps x 8 gamma x 20 seeds RaCO-DP, 4 x 7 lambda x 20
    DP-FERMI, 8 gamma x 20 seeds non-private SGDA."""
    sw = yaml.safe_load((SWEEPS_DIR / "fig4_adult.yaml").read_text())["hydra"]["sweeper"]
    jobs = plan_jobs(sw["grids"], None, [])
    count = {g: sum(1 for n, _ in jobs if n == g) for g in sw["grids"]}
    assert count == {"raco_dp": 640, "dp_fermi": 560, "sgda": 160}


def _loader_and_master(overrides):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    from raco_cli.cli.paths import CONF_DIR
    from raco_cli.cli.plugins import register_resolvers
    from raco_cli.cli.sweeper import register

    register_resolvers()
    register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
    master = loader.load_configuration("config", overrides=list(overrides), run_mode=RunMode.MULTIRUN)
    return loader, master


def _smoke_sweeper(name: str):
    """The sweeper of a sweep file in smoke mode, its config loader and master config, and its jobs."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from raco_cli.cli.sweeper import RacoSweeper

    loader, master = _loader_and_master([f"+sweep={name}", "hydra.sweeper.smoke=true"])
    sw = OmegaConf.to_container(master.hydra.sweeper, resolve=False)
    sweeper = RacoSweeper(grids=sw["grids"], smoke=True, smoke_params=sw.get("smoke_params"), smoke_overrides=sw.get("smoke_overrides"))
    sweeper.hydra_context, sweeper.config = SimpleNamespace(config_loader=loader), master
    jobs = plan_jobs(sw["grids"], None, [f"+sweep={name}"], smoke=True, smoke_params=sw.get("smoke_params"),
                     smoke_overrides=sw.get("smoke_overrides"))
    return sweeper, loader, master, jobs


@pytest.mark.parametrize("name", ["fig4_adult", "fig6_credit", "fig8b_hard_soft"])
def test_each_job_is_composed_once_and_equals_a_full_composition(name):
    """The sweeper composes group options once and applies value overrides with Hydra's own
    function: every job's config equals Hydra's full composition of that job."""
    from omegaconf import OmegaConf, open_dict

    sweeper, loader, master, jobs = _smoke_sweeper(name)
    for _, overrides in jobs[:: max(1, len(jobs) // 12)]:
        full = loader.load_sweep_config(master_config=master, sweep_overrides=list(overrides))
        with open_dict(full):
            del full["hydra"]
        assert sweeper._job_config(overrides) == OmegaConf.to_container(full, resolve=True), overrides
    assert len(sweeper._composed.composed) <= len(sweeper.grids)  # one composition per set of group options


def _job_hashes(name: str) -> dict[str, str]:
    """Config hash -> MLflow experiment of every (smoke) job of a sweep file, as the sweeper composes them."""
    from raco_cli.run.spec import config_hash

    sweeper, _, _, jobs = _smoke_sweeper(name)
    out = {}
    for _, overrides in jobs:
        cfg = sweeper._job_config(overrides)
        out[config_hash(cfg)] = cfg["tracking"]["experiment"]
    return out


def test_fig8b_soft_arm_is_fig4_adults_eps1_grid():
    """Fig. 8b's soft-dual runs are fig4_adult's eps = 1 RaCO-DP runs (same config hash, same
    experiment), so a sweep after fig4_adult skips them and trains only the hard arm."""
    fig4, fig8b = _job_hashes("fig4_adult"), _job_hashes("fig8b_hard_soft")
    shared = set(fig4) & set(fig8b)
    assert len(shared) == len(fig8b) // 2 > 0  # the soft half, every seed and gamma
    assert {fig4[h] for h in shared} == {fig8b[h] for h in fig8b} == {"fig4_adult"}


def _cfg(**changes):
    cfg = {"seed": 0, "eps": 1.0, "method": {"name": "raco_dp", "lr": 1.0, "sampling": "independent", "clip_norm": 1.0, "options": {}},
           "model": {"name": "logreg"}, "dataset": {"name": "adult"}, "constraint": {"name": "dp", "gamma": 0.05},
           "tracking": {"experiment": "x"}}
    for key, value in changes.items():
        node = cfg
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return cfg


def test_jobs_that_differ_in_what_a_sweep_varies_share_a_group():
    from raco_cli.cli.sweep_plan import group_key

    base = group_key(_cfg())
    assert base is not None
    for change in ({"seed": 3}, {"eps": 9.0}, {"constraint.gamma": 0.2}, {"method.lr": 0.1}, {"method.clip_norm": 2.0},
                   {"method.options": {"lam": 2}}, {"tracking.experiment": "y"}):
        assert group_key(_cfg(**change)) == base, change
    for change in ({"method.sampling": "shared"}, {"dataset.name": "credit"}, {"method.clip_norm": None},
                   {"method.name": "dp_sgd"}):
        assert group_key(_cfg(**change)) != base, change
    assert group_key(_cfg(**{"model.name": "mlp"})) is None  # one-run path
    assert group_key(_cfg(**{"method.name": "dpse"})) is None


def test_the_static_list_of_batched_methods_is_the_methods_with_fit_many():
    """The sweeper groups by :data:`raco_cli.methods.BATCHED` so that planning a sweep does not
    import torch; it must name exactly the methods whose module has ``fit_many``."""
    from raco_cli import methods

    assert set(methods.BATCHED) == {name for name in methods.METHODS if hasattr(methods.get(name), "fit_many")}


def test_grouping_a_sweep_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from raco_cli.cli.sweep_plan import group_key; "
            "assert group_key({'method': {'name': 'raco_dp'}, 'model': {'name': 'logreg'}}) is not None; "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_balance_keeps_every_run_once_costliest_first_and_never_lengthens_the_sweep():
    import random

    from raco_cli.cli.sweep_plan import JOB_OVERHEAD, balance, lpt_makespan

    rng = random.Random(0)
    for _ in range(200):
        workers = rng.choice([1, 2, 3, 4])
        groups, start = [], 0
        for _ in range(rng.randint(1, 6)):
            n = rng.randint(1, 160)
            groups.append((list(range(start, start + n)), rng.choice([1.0, 3.0, 10.0])))
            start += n
        pieces = balance(groups, workers)
        assert sorted(r for p in pieces for r in p) == list(range(start))
        cost_of = {r: c for runs, c in groups for r in runs}
        costs = [sum(cost_of[r] for r in p) for p in pieces]
        if workers == 1:
            assert pieces == [runs for runs, _ in groups]  # one worker: as they were
            continue
        assert costs == sorted(costs, reverse=True)
        assert all(len({cost_of[r] for r in p}) == 1 for p in pieces)  # a piece never mixes groups
        fixed = JOB_OVERHEAD * sum(len(r) * c for r, c in groups) / len(groups)
        before = lpt_makespan(sorted((fixed + len(r) * c for r, c in groups), reverse=True), workers)
        assert lpt_makespan([fixed + c for c in costs], workers) <= before + 1e-9


def test_lpt_makespan_is_the_wall_time_of_workers_taking_the_next_job():
    from raco_cli.cli.sweep_plan import lpt_makespan

    assert lpt_makespan([5, 4, 3], 2) == 7  # (5), (4 + 3)
    assert lpt_makespan([3, 4, 5], 2) == 8  # (3 + 5), (4)
    assert lpt_makespan([3, 4, 5], 1) == 12


def test_run_cost_counts_steps_and_evaluations():
    from raco_cli.cli.sweep_plan import EVAL_STEPS, known_steps, run_cost

    assert run_cost({"method": {"steps": 400, "eval_every": 5}}) == 400 * (1 + EVAL_STEPS / 5)
    assert run_cost({"method": {"steps": None, "max_steps": 3000, "eval_every": 50}}) == 3000 * (1 + EVAL_STEPS / 50)
    # T left to the privacy plan: the sweep's other jobs' mean steps (fig5_heart: RaCO-DP beside SGDA's 600)
    assert run_cost({"method": {"steps": None, "max_steps": 3000, "eval_every": 50}}, unknown_steps=600) == 600 * (1 + EVAL_STEPS / 50)
    assert known_steps([{"method": {"steps": None}}, {"method": {"steps": 600}}, {"method": {"steps": 400}}]) == 500
    assert known_steps([{"method": {"steps": None}}]) is None


@pytest.mark.parametrize("workers", [1, 2])
def test_launches_go_costliest_first_to_parallel_workers_and_in_job_order_to_one(tmp_path, workers):
    from omegaconf import OmegaConf

    from raco_cli.cli.sweep_plan import GROUP_OVERRIDE
    from raco_cli.cli.sweeper import RacoSweeper
    from raco_cli.run.group import read_group

    launcher = ({"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": workers}
                if workers > 1 else {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"})
    sweeper = RacoSweeper()
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": "${hydra.job.num}"}, "launcher": launcher}})
    cheap = [_cfg(seed=s, **{"method.steps": 10}) for s in range(4)]  # first in the sweep, cheapest
    dear = [_cfg(seed=s, **{"method.steps": 1000, "method.name": "sgda"}) for s in range(40)]
    jobs = [([f"seed={i}"], cfg) for i, cfg in enumerate(cheap + dear)]
    launches = sweeper._launches(jobs, tmp_path, ["g"] * len(jobs))
    members = [[m["num"] for m in read_group(next(o for o in job if o.startswith(GROUP_OVERRIDE))[len(GROUP_OVERRIDE):])]
               for job in launches]
    assert sorted(n for m in members for n in m) == list(range(44))  # every run once, its job number kept
    if workers == 1:
        assert members == [[0, 1, 2, 3], list(range(4, 44))]
    else:  # the dear group halved (one worker would otherwise run it alone), and first
        assert members == [list(range(4, 24)), list(range(24, 44)), [0, 1, 2, 3]]


@pytest.mark.parametrize("group", [True, False])
def test_in_one_job_grids_share_one_launch_of_runs_trained_alone(tmp_path, group):
    """hydra.sweeper.in_one_job: the grid's runs go, in job order and each flagged to train by the
    one-run path, into one launcher job; the other grids are grouped (or not) as before."""
    from omegaconf import OmegaConf

    from raco_cli.cli.sweep_plan import GROUP_OVERRIDE
    from raco_cli.cli.sweeper import RacoSweeper
    from raco_cli.run.group import read_group

    sweeper = RacoSweeper(group=group, in_one_job="timing")
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": "${hydra.job.num}"},
                                                 "launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}}})
    alone = [_cfg(seed=s, **{"method.name": "dp_sgd" if s % 2 else "sgd"}) for s in range(5)]  # any mix: each trains alone
    batched = [_cfg(seed=s) for s in range(6)]
    jobs = [([f"seed={i}"], cfg) for i, cfg in enumerate(alone + batched)]
    launches = sweeper._launches(jobs, tmp_path, ["timing"] * 5 + ["timing_batched"] * 6)
    groups = [next((o[len(GROUP_OVERRIDE):] for o in job if o.startswith(GROUP_OVERRIDE)), None) for job in launches]
    first = read_group(groups[0])
    assert [m["num"] for m in first] == [0, 1, 2, 3, 4] and all(m["alone"] for m in first)
    assert [m["config"] for m in first] == alone and [m["run_dir"] for m in first] == [str(tmp_path / str(n)) for n in range(5)]
    if group:
        assert len(launches) == 2 and [m["num"] for m in read_group(groups[1])] == list(range(5, 11))
        assert not any(m.get("alone") for m in read_group(groups[1]))
    else:  # one job per run for the rest
        assert len(launches) == 7 and groups[1:] == [None] * 6
