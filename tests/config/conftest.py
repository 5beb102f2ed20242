"""Fixtures of the config tests."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from raco_cli.cli.paths import CONF_DIR, register_resolvers


@pytest.fixture
def composer():
    """``composer(overrides)`` -> the composed job config of ``conf/`` (Hydra context held open)."""
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield lambda overrides=(): compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
