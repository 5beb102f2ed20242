"""raco tune's search space (raco_cli/run/tune_space.py): the paper's ranges, each method's keys,
and Optuna's values as config overrides."""

from __future__ import annotations

from raco_cli.run import tune_space


def test_search_space_follows_the_paper_ranges():
    """App. E.2: sigma in [3, 6], Laplace b in [0.1, 0.5], B in [256, 1256], tau in [1, 10]."""
    s = tune_space.SPACE
    assert (s["noise_multiplier"].low, s["noise_multiplier"].high) == (3.0, 6.0)
    assert (s["laplace_b"].low, s["laplace_b"].high, s["laplace_b"].inverse) == (0.1, 0.5, True)
    assert (s["batch_size"].low, s["batch_size"].high, s["batch_size"].integer) == (256, 1256, True)
    assert (s["temperature"].low, s["temperature"].high) == (1.0, 10.0)
    # our hist_noise_multiplier is the Laplace scale per unit sensitivity: 1/b
    assert tune_space.trial_overrides({"laplace_b": 0.5, "batch_size": 300}, "raco_dp") == [
        "method.hist_noise_multiplier=2.0", "method.batch_size=300"]


def test_dp_fermi_searches_its_fairness_weight():
    """DP-FERMI cannot take gamma: lambda (and its W step) must be in its search, or a gamma
    that needs a large lambda would have no feasible trial."""
    names = tune_space.METHOD_SPACE["dp_fermi"]
    assert {"lam", "lr_dual", "lr", "noise_multiplier", "batch_size"} == set(names)
    assert tune_space.trial_overrides({"lam": 4.0}, "dp_fermi") == ["method.options.lam=4.0"]


def test_dro_methods_search_the_same_keys_and_each_override_is_a_valid_config():
    """Equal tuning (docs/dro.md): the private DRO methods search lr, the dual step and T, the SPIDER
    methods also their phase q and the corrections' clip scale; every drawn value is a config the
    run accepts."""
    from raco_cli.cli.validate import compose_config
    from raco_cli.run.spec import build_run_spec

    common = {"lr", "lr_dual_dro", "steps", "clip_norm"}
    assert set(tune_space.space_of("dp_sgda", "dro")) == common == set(tune_space.space_of("dp_private_diff", "dro"))
    for method in ("dp_double_spider", "dp_recursive_spider"):
        assert set(tune_space.space_of(method, "dro")) == common | {"phase", "diff_clip_scale"}
        names = tune_space.space_of(method, "dro")
        values = {n: tune_space.SPACE[n].high if n != "steps" else 200 for n in names}
        ovr = tune_space.trial_overrides(values, method)
        assert "method.options.phase=200" in ovr and "method.steps=200" in ovr
        build_run_spec(compose_config(["objective=dro", f"method={method}", "dataset=synthetic", "constraint=none",
                                       "privacy.scope=paper", "tracking=none", *ovr]))
    assert tune_space.space_of("sgda") == tune_space.METHOD_SPACE["sgda"]  # the fairness search is unchanged
