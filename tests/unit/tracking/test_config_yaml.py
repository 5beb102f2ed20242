"""config.yaml (tracking/summary.py write_config): libyaml's dumper writes PyYAML's text."""

from __future__ import annotations

import yaml

from raco_cli.tracking.summary import write_config


def test_config_yaml_is_pyyamls_safe_dump_and_reads_back(tmp_path):
    """Values that YAML could misread (strings that look like null, booleans, numbers or dates),
    tiny and huge floats, unicode, nested lists and dicts in config order: the file is exactly
    ``yaml.safe_dump``'s text and loads back to the same config."""
    resolved = {
        "seed": 3, "eps": 1.0, "delta": 1e-05, "big": 1.5e300, "lr": None, "flag": True,
        "strings": ["null", "yes", "1.0", "2026-11-27", "~", "a: b", "ümlaut ε", "", " lead"],
        "zeta": {"nested": [1, [2, 3], {"k": "v"}], "empty_list": [], "empty": {}},
        "alpha": "last key, config order kept",
    }
    path = write_config(resolved, tmp_path / "config.yaml")
    text = path.read_text(encoding="utf-8")
    assert text == yaml.safe_dump(resolved, sort_keys=False, default_flow_style=False, allow_unicode=True)
    assert yaml.safe_load(text) == resolved
    assert list(yaml.safe_load(text)) == list(resolved)
