"""raco_cli/cli/compose_cache.py: composing each defaults list once gives Hydra's full composition."""

from __future__ import annotations

import pytest

CASES = [
    ["seed=3"],
    ["method=dp_fermi", "seed=1", "method.lr=0.5"],
    ["dataset=credit", "constraint=dp", "eps=0.5", "constraint.gamma=0.02"],
    ["+sweep=fig4_adult", "method=raco_dp", "eps=9", "seed=2"],
    ["+sweep=fig8b_hard_soft", "method.dual=hard", "seed=0"],
    ["method=dp_double_spider", "objective=dro", "method.options.phase=5", "+method.options.extra=1"],
    ["constraint=combo", "constraint.parts=dp+fnr", "seed=4"],
    ["+tracking.tags={sweep: x, k: 2}", "seed=5"],
]


@pytest.fixture
def hydra_session():
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra

    from raco_cli.cli.paths import CONF_DIR
    from raco_cli.cli.plugins import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        assert isinstance(loader, ConfigLoaderImpl)
        yield loader
    GlobalHydra.instance().clear()


def _cache(loader):
    from hydra import compose

    from raco_cli.cli.compose_cache import ComposeCache

    return ComposeCache(loader.repository, lambda structural: compose(config_name="config", overrides=structural))


def test_each_variant_equals_a_full_composition(hydra_session):
    from hydra import compose
    from omegaconf import OmegaConf

    cache = _cache(hydra_session)
    for overrides in CASES:
        full = compose(config_name="config", overrides=overrides)
        got = cache(overrides)
        assert OmegaConf.to_container(got, resolve=True) == OmegaConf.to_container(full, resolve=True), overrides
        assert OmegaConf.is_struct(got)  # a misspelt key still fails as under Hydra
    # value overrides never reach the defaults list: one composition per set of group options
    # (none; method; dataset+constraint; sweep+method; sweep; method+objective; constraint)
    assert len(cache.composed) == 7


def test_the_cached_base_is_not_changed_by_a_variant(hydra_session):
    from omegaconf import OmegaConf

    cache = _cache(hydra_session)
    assert OmegaConf.select(cache(["seed=7"]), "seed") == 7
    assert OmegaConf.select(cache(["seed=8"]), "seed") == 8
    assert OmegaConf.select(cache([]), "seed") == OmegaConf.select(next(iter(cache.composed.values())), "seed") != 8


@pytest.mark.parametrize("overrides", [["method.lrr=1"], ["seed=3", "+seed=4"], ["~nonexistent"]])
def test_errors_are_hydras_errors(hydra_session, overrides):
    from hydra import compose

    cache = _cache(hydra_session)
    with pytest.raises(Exception) as full:  # noqa: PT011 - whatever Hydra raises, the cache raises the same
        compose(config_name="config", overrides=overrides)
    with pytest.raises(type(full.value)) as got:
        cache(overrides)
    assert str(got.value) == str(full.value)


def test_prevalidate_composes_each_defaults_list_once(monkeypatch):
    """A 160-seed sweep composes one defaults list (it composed 160 before), and a bad value
    among the seeds is still reported."""
    import hydra

    from raco_cli.cli.validate import prevalidate
    from raco_cli.errors import ConfigError

    calls = []
    real = hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(k.get("overrides")) or real(*a, **k))
    prevalidate(["seed=range(0,160)", "method=raco_dp"])
    assert len(calls) == 1
    with pytest.raises(ConfigError, match="eps"):
        prevalidate(["eps=1,-2", "method=raco_dp"])


def test_reused_parsed_overrides_give_full_compositions(hydra_session, monkeypatch):
    """Each distinct override string is parsed once per cache, and a parsed override reused by
    later jobs (a dict value among them) gives each job Hydra's full composition."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    jobs = [CASES[-1], ["seed=5", "+tracking.tags={sweep: x, k: 2}", "method=dp_fermi"], CASES[1], CASES[-1], CASES[1][::-1]]
    full = [OmegaConf.to_container(compose(config_name="config", overrides=job), resolve=True) for job in jobs]
    warm = _cache(hydra_session)
    for job in jobs:
        warm(job)
    cache = _cache(hydra_session)
    cache.composed = warm.composed  # the bases (Hydra's own compositions parse overrides too): only the cache's parses counted
    parsed: list[str] = []
    real = OverridesParser.parse_overrides
    monkeypatch.setattr(OverridesParser, "parse_overrides", lambda self, overrides: parsed.extend(overrides) or real(self, overrides))
    assert [OmegaConf.to_container(cache(job), resolve=True) for job in jobs] == full
    assert sorted(parsed) == sorted({o for job in jobs for o in job})  # each string once, however many jobs repeat it
