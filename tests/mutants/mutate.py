"""The privacy mutation suite: plant each privacy bug of ``tests/mutants/*.toml`` in a scratch
copy of the tree and check that the tests it names fail (``make test-mutants``).

A mutant file holds a one-line ``description`` of the bug it plants, the ``tests`` (pytest node
ids, default tests only) that must catch it, and one or more edits: ``file``, an exact ``search``
string that must occur exactly once in that file, and its ``replace``-ment (top-level keys for
one edit, ``[[edit]]`` tables for several).  Exact strings rather than line numbers or diff
hunks: an unrelated edit elsewhere in the file leaves the mutant applicable, and an edit of the
mutated code itself makes it *not apply*, which fails the suite loudly (it never counts as
killed) so that the mutant gets updated with the code.

For each mutant the runner copies the tree (no ``.venv``, ``.git``, outputs or data) to a
scratch directory, applies the edits there, and runs only the named tests with this
interpreter (the worktree's ``.venv``) and ``PYTHONPATH``/``cwd`` set to the copy; it checks
first that ``raco_cli`` is imported from the copy.  Before any mutant, the named tests must
pass on the unmutated copy and none may be deselected as slow.  Outcomes:

* ``killed``: pytest exit code 1 (a named test failed); the failing tests are listed;
* ``survived``: every named test passed with the bug planted;
* ``not applied`` / ``error``: a search string not found exactly once, or pytest could not run
  the tests (collection error, timeout): never counted as killed.

The last line is ``mutants killed: K of N``; the exit code is 0 only when every mutant is killed.

Usage: ``python tests/mutants/mutate.py [--jobs N] [--keep] [--list] [name ...]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = Path(__file__).resolve().parent
MARKERS = "not slow and not gpu"  # make test's selection: every mutant must die in the fast suite
IGNORE = (".venv", ".git", "outputs", "multirun", "datasets", "__pycache__", ".pytest_cache", ".mypy_cache",
          ".ruff_cache", ".hypothesis", "*.egg-info", "*.pyc")
TIMEOUT_S = 900


@dataclass(frozen=True)
class Edit:
    file: str
    search: str
    replace: str


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    tests: tuple[str, ...]
    edits: tuple[Edit, ...]


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | not applied | error
    detail: str = ""
    seconds: float = 0.0


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def load(path: Path) -> Mutant:
    """Parse one mutant file.

    Raises:
        ValueError: a missing or malformed field (one line naming the file and the field).
    """
    raw = _toml(path)
    where = f"{path.name}:"
    description = raw.get("description")
    if not isinstance(description, str) or not description.strip() or "\n" in description.strip():
        raise ValueError(f"{where} 'description' must be one non-empty line")
    tests = raw.get("tests")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and "::" in t for t in tests):
        raise ValueError(f"{where} 'tests' must be a non-empty list of pytest node ids (path::test)")
    tables = raw.get("edit", [])
    if "file" in raw:
        tables = [{k: raw[k] for k in ("file", "search", "replace") if k in raw}, *tables]
    if not tables:
        raise ValueError(f"{where} no edit (give file/search/replace or [[edit]] tables)")
    edits = []
    for i, t in enumerate(tables):
        if not all(isinstance(t.get(k), str) for k in ("file", "search", "replace")) or not t["search"]:
            raise ValueError(f"{where} edit {i} needs string file, search (non-empty) and replace")
        if t["search"] == t["replace"]:
            raise ValueError(f"{where} edit {i} replaces its search string by itself")
        edits.append(Edit(t["file"], t["search"], t["replace"]))
    return Mutant(path.stem, description.strip(), tuple(tests), tuple(edits))


def load_all(names: list[str] | None = None) -> list[Mutant]:
    mutants = [load(p) for p in sorted(MUTANTS.glob("*.toml"))]
    if names:
        unknown = sorted(set(names) - {m.name for m in mutants})
        if unknown:
            raise SystemExit(f"error: unknown mutant(s) {', '.join(unknown)}; see {MUTANTS}/*.toml")
        mutants = [m for m in mutants if m.name in names]
    return mutants


def apply(mutant: Mutant, tree: Path) -> str | None:
    """Apply the mutant's edits to ``tree`` in place; the reason when it does not apply."""
    texts: dict[Path, str] = {}
    for edit in mutant.edits:
        path = tree / edit.file
        if path not in texts:
            if not path.is_file():
                return f"{edit.file} does not exist"
            texts[path] = path.read_text()
        count = texts[path].count(edit.search)
        if count != 1:
            first = edit.search.strip().splitlines()[0][:70]
            return f"search string found {count} times in {edit.file}: {first!r}"
        texts[path] = texts[path].replace(edit.search, edit.replace)
    for path, text in texts.items():
        path.write_text(text)
    return None


def copy_tree(dest: Path, source: Path = ROOT) -> Path:
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(*IGNORE))
    return dest


def environment(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["RACO_HYPOTHESIS_PROFILE"] = "ci"  # derandomized, as in make test
    # tiny tensors: one thread per process is faster than oversubscribed pools
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


def check_imports_from(tree: Path) -> None:
    """The copy, not the worktree the venv was installed from, must be what tests import."""
    code = ("import raco_cli, raco_cli.methods.sgda.core, raco_cli.privacy.accountant, raco_cli.audit.one_run as a; "
            "print(raco_cli.__file__); print(raco_cli.methods.sgda.core.__file__); print(a.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=environment(tree), capture_output=True, text=True)
    files = out.stdout.split()
    if out.returncode != 0 or len(files) != 3 or not all(Path(f).resolve().is_relative_to(tree.resolve()) for f in files):
        raise SystemExit(f"error: the scratch copy {tree} is not what Python imports ({out.stdout.strip()} {out.stderr.strip()})")


def pytest_args(tree: Path, tests: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(tree),
            "-c", str(tree / "pyproject.toml"), "-m", MARKERS, *tests]


def baseline(tree: Path, mutants: list[Mutant]) -> str | None:
    """None when every named test exists, is a default test and passes unmutated."""
    tests = tuple(sorted({t for m in mutants for t in m.tests}))
    collect = subprocess.run([*pytest_args(tree, tests), "--collect-only"], cwd=tree, env=environment(tree),
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    if collect.returncode != 0:
        return "the named tests do not collect:\n" + _tail(collect.stdout + collect.stderr)
    if "deselected" in collect.stdout:
        return "some named tests are deselected by -m '" + MARKERS + "' (slow or gpu): mutants must die in make test\n" + _tail(collect.stdout)
    run = subprocess.run(pytest_args(tree, tests), cwd=tree, env=environment(tree), capture_output=True, text=True, timeout=TIMEOUT_S)
    if run.returncode != 0:
        return "the named tests fail on the unmutated tree:\n" + _tail(run.stdout + run.stderr)
    return None


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def run_one(mutant: Mutant, scratch: Path, base: Path) -> Outcome:
    """Copy the unmutated snapshot ``base`` (taken once, so edits to the worktree during a run
    do not leak in), apply the mutant, run its tests."""
    t0 = time.perf_counter()
    tree = copy_tree(scratch / mutant.name, base)
    reason = apply(mutant, tree)
    if reason is not None:
        return Outcome(mutant, "not applied", reason, time.perf_counter() - t0)
    check_imports_from(tree)
    try:
        res = subprocess.run(pytest_args(tree, mutant.tests), cwd=tree, env=environment(tree), capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Outcome(mutant, "error", f"timeout after {TIMEOUT_S} s", time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if res.returncode == 1:
        failed = re.findall(r"^FAILED (\S+)", res.stdout, flags=re.MULTILINE)
        return Outcome(mutant, "killed", "by " + ", ".join(failed) if failed else "", seconds)
    if res.returncode == 0:
        return Outcome(mutant, "survived", "every named test passed", seconds)
    return Outcome(mutant, "error", f"pytest exit code {res.returncode}:\n" + _tail(res.stdout + res.stderr), seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (file stems; default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run in parallel (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the named tests")
    args = parser.parse_args(argv)
    try:
        mutants = load_all(args.names)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.name:40s} {m.description}")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="raco-mutants-"))
    t0 = time.perf_counter()
    try:
        base = copy_tree(scratch / "_unmutated")
        check_imports_from(base)
        if not args.no_baseline:
            problem = baseline(base, mutants)
            if problem is not None:
                print(f"error: {problem}", file=sys.stderr)
                print(f"mutants killed: 0 of {len(mutants)}")
                return 1
            print(f"baseline: the {len({t for m in mutants for t in m.tests})} named tests pass unmutated", flush=True)
        outcomes: list[Outcome] = []

        def report(o: Outcome) -> None:
            detail = o.detail if o.status != "error" else o.detail.replace("\n", "\n      ")
            print(f"{o.status.upper():12s} {o.mutant.name:40s} {o.seconds:5.1f}s  {o.mutant.description}\n"
                  f"             {detail}", flush=True)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for outcome in pool.map(lambda m: run_one(m, scratch, base), mutants):
                report(outcome)
                outcomes.append(outcome)
    finally:
        if args.keep:
            print(f"scratch copies kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    killed = sum(o.status == "killed" for o in outcomes)
    others = [o for o in outcomes if o.status != "killed"]
    print(f"{len(outcomes)} mutants in {time.perf_counter() - t0:.0f} s; " +
          ("all killed" if not others else "not killed: " + ", ".join(f"{o.mutant.name} ({o.status})" for o in others)))
    print(f"mutants killed: {killed} of {len(outcomes)}")
    return 0 if killed == len(outcomes) and outcomes else 1


if __name__ == "__main__":
    raise SystemExit(main())
