"""The mutation suite's own checks (fast, in make test): every mutant file is well formed, still
applies to the tree (so a change to the mutated code shows up here first, not only in
``make test-mutants``), and names tests that exist.  Plus the runner's apply logic."""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutate as mutants  # noqa: E402  (tests/mutants/mutate.py, the runner)

ALL = mutants.load_all()


def test_there_are_mutants_for_every_privacy_piece():
    assert len(ALL) >= 14
    files = {e.file for m in ALL for e in m.edits}
    for module in ("raco_cli/methods/sgda/core.py", "raco_cli/methods/dp_fermi.py", "raco_cli/methods/dpse.py",
                   "raco_cli/privacy/joint_pld.py", "raco_cli/privacy/mechanisms.py", "raco_cli/privacy/preprocessing.py",
                   "raco_cli/privacy/selection.py", "raco_cli/methods/planning.py", "raco_cli/privacy/estimates.py"):  # fmt: skip
        assert module in files, module


@pytest.mark.parametrize("mutant", ALL, ids=[m.name for m in ALL])
def test_mutant_applies_and_names_existing_tests(mutant, tmp_path):
    for edit in mutant.edits:
        text = (mutants.ROOT / edit.file).read_text()
        assert text.count(edit.search) == 1, f"{mutant.name}: search string no longer found exactly once in {edit.file}; update the mutant"
    for node in mutant.tests:
        path, _, name = node.partition("::")
        source = (mutants.ROOT / path).read_text()
        functions = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert name.split("[")[0] in functions, f"{mutant.name}: {node} does not exist"
    # applied to a copy of the mutated files, the result still compiles
    for edit in mutant.edits:
        (tmp_path / edit.file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(mutants.ROOT / edit.file, tmp_path / edit.file)
    assert mutants.apply(mutant, tmp_path) is None
    for edit in {e.file for e in mutant.edits}:
        compile((tmp_path / edit).read_text(), edit, "exec")


def test_a_mutant_that_does_not_apply_is_reported_not_killed(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    twice = mutants.Mutant("m", "d", ("t.py::test",), (mutants.Edit("a.py", "x = 1", "x = 2"),))
    assert "found 2 times" in str(mutants.apply(twice, tmp_path))
    absent = mutants.Mutant("m", "d", ("t.py::test",), (mutants.Edit("a.py", "y = 1", "y = 2"),))
    assert "found 0 times" in str(mutants.apply(absent, tmp_path))
    assert (tmp_path / "a.py").read_text() == "x = 1\nx = 1\n"  # nothing written


def test_malformed_mutant_files_are_rejected(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('description = "two\\nlines"\ntests = ["a.py::t"]\nfile = "a.py"\nsearch = "x"\nreplace = "y"\n')
    with pytest.raises(ValueError, match="one non-empty line"):
        mutants.load(bad)
    bad.write_text('description = "d"\ntests = ["a.py"]\nfile = "a.py"\nsearch = "x"\nreplace = "y"\n')
    with pytest.raises(ValueError, match="node ids"):
        mutants.load(bad)
    bad.write_text('description = "d"\ntests = ["a.py::t"]\n')
    with pytest.raises(ValueError, match="no edit"):
        mutants.load(bad)
