"""A run equals itself in any group on every instruction set this machine can emulate.

A grouped run and the same run alone are one computation (docs/batched.md, "One path"), so
they agree to the last bit whatever the CPU.  What the CPU changes is how each library's code
is compiled or dispatched: numba compiles the data pass for the host's vector width, numpy and
torch pick AVX-512, AVX2 or SSE kernels at run time.  A difference between the grouped and the
lone path that shows on one vector width only (a sum whose order depends on where a run's
entries fall in the vectors, a reduction blocked by the group's size) therefore passes on one
machine and fails on another, which is how an earlier version failed on an AVX-512 machine and
passed on an AVX2 one.  These tests run ``one_path_probe.py`` (each case's runs alone and in two
groups, compared bit for bit) in subprocesses whose environment makes every library target
another instruction set:

* ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``: the compiled data pass for that CPU (its vector
  width, FMA or not);
* ``NPY_DISABLE_CPU_FEATURES``: numpy's SIMD kernels (exp, log, reductions) of a smaller set;
* ``ATEN_CPU_CAPABILITY``: torch's elementwise and reduction kernels (``avx2``, ``default``);
* ``MKL_ENABLE_INSTRUCTIONS``: MKL's kernels (torch's random number transforms).

The fast test runs the probe under one instruction set other than the host's (AVX2, or SSE on
a machine without AVX-512); ``make test-widths`` (slow) under every one the host can run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "e2e" / "one_path_probe.py"
AVX512 = "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"


def host_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def instruction_sets() -> dict[str, dict[str, str]]:
    """The environments of the instruction sets this host can run, by name."""
    flags = host_flags()
    out: dict[str, dict[str, str]] = {"host": {}}
    if {"avx2", "fma"} <= flags:
        out["avx2"] = {"NUMBA_CPU_NAME": "haswell", "NPY_DISABLE_CPU_FEATURES": AVX512, "ATEN_CPU_CAPABILITY": "avx2",
                       "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    if "avx512f" in flags:
        out["avx512"] = {"NUMBA_CPU_NAME": "skylake-avx512", "ATEN_CPU_CAPABILITY": "avx512"}
    out["sse"] = {"NUMBA_CPU_NAME": "x86-64", "NPY_DISABLE_CPU_FEATURES": f"{AVX512} AVX2 FMA3 F16C AVX X86_V3 X86_V4",
                  "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    if not flags or os.uname().machine not in ("x86_64", "AMD64"):
        return {"host": {}}
    return out


def run_probe(env: dict[str, str], *cases: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(PROBE), *cases], cwd=ROOT, env=full, capture_output=True, text=True, timeout=900)


def other_instruction_set() -> str:
    sets = instruction_sets()
    return "avx2" if "avx512f" in host_flags() and "avx2" in sets else ("sse" if "sse" in sets else "host")


def test_a_run_equals_itself_in_any_group_under_another_instruction_set():
    name = other_instruction_set()
    res = run_probe(instruction_sets()[name], "raco_dp", "raco_dp-model-scope-standardised", "dp_sgd-sparse")
    assert res.returncode == 0, f"under {name}: {res.stderr[-2000:]}"
    assert len(res.stdout.splitlines()) == 3


@pytest.mark.slow
@pytest.mark.parametrize("name", list(instruction_sets()))
def test_a_run_equals_itself_in_any_group_on_every_instruction_set(name):
    res = run_probe(instruction_sets()[name])
    assert res.returncode == 0, f"under {name}: {res.stderr[-2000:]}"
    print(f"{name}: {res.stdout}")
