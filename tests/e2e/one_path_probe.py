"""Every run alone and in groups, bit for bit: the probe the instruction-set checks run in a
subprocess (tests/e2e/test_instruction_sets.py), under environment variables that make numba,
numpy and torch compile or dispatch for another instruction set.

``python tests/e2e/one_path_probe.py [case ...]`` trains each case's three runs alone (``fit``:
a group of one on the CPU), as one group, and as one group in reverse order, and compares every
number each run returns (model, every evaluation, multipliers, statistics, release counts) to
the last bit.  It prints one line per case, ``<case> <digest>`` (a hash of the run's numbers,
the same for alone and grouped), and exits 1 on the first difference, naming it.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from raco_cli import constraints, methods, models
from raco_cli.data import synthetic
from raco_cli.methods import batched
from raco_cli.methods.base import MethodSpec, NullReporter, Seeds
from raco_cli.privacy.mechanisms import noise_source
from raco_cli.privacy.preprocessing import apply_scaling, dp_scaling

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the specs the unit tests build
from specs import paper_spec  # noqa: E402

STEPS = 25
CPU = torch.device("cpu")
TIMES = ("time_per_step_ms", "first_step_ms", "throughput_images_per_s", "batched")


def _specs(name: str, **kw) -> list[MethodSpec]:
    private = methods.get(name).PRIVATE
    base = paper_spec(name=name, batch_size=120, eval_every=10, lr=1.0, clip_norm=1.0 if private else None,
                      noise_multiplier=1.0 if private else None, hist_noise_multiplier=2.0 if private else None,
                      selection_eps=0.5 if kw.get("scope") == "model" else 0.0)
    base = replace(base, **kw)
    out = []
    for i in range(3):
        s = replace(base, lr=base.lr * (0.5 + 0.5 * i), temperature=1.0 + (i % 2), lr_dual=0.1 * (1 + i))
        if private:
            s = replace(s, noise_multiplier=1.0 + 0.3 * i, hist_noise_multiplier=2.0 + i)
        if name == "dp_fermi":
            s = replace(s, options={"lam": 1.0 + i, "noise_multiplier_w": 2.0 + i}, hist_noise_multiplier=None, temperature=1.0)
        out.append(s)
    return out


def _public(data):
    """The first 5 columns as a public-bounds encoding in [-1, 1] (per-run DP standardisation)."""
    X = np.array(data.X, dtype=np.float32)
    X[:, :5] = np.tanh(X[:, :5])
    return replace(data, X=X, meta={**data.meta, "preprocessing": "public", "numeric_features": 5})


def _cases() -> dict[str, tuple]:
    wide = synthetic.load(n=1500, n_features=37, seed=1)
    three = synthetic.load(n=1200, n_features=11, n_classes=3, seed=2)
    public = _public(wide)
    scalings = [dp_scaling(public, noise_multiplier=2.0, source=noise_source(i, "cpu", secure=False)) for i in range(3)]
    return {
        "raco_dp": (wide, "raco_dp", _specs("raco_dp"), None),
        "raco_dp-shared-hard": (wide, "raco_dp", _specs("raco_dp", sampling="shared", dual="hard"), None),
        "raco_dp-model-scope-standardised": (public, "raco_dp", _specs("raco_dp", scope="model"), scalings),
        "raco_dp-adam-average": (wide, "raco_dp", _specs("raco_dp", optimizer="adam", lr=0.05, selection="average"), None),
        "raco_dp-three-classes": (three, "raco_dp", _specs("raco_dp"), None),
        "dp_sgd-sparse": (wide, "dp_sgd", _specs("dp_sgd", batch_size=12), None),
        "dp_fermi-model-scope": (public, "dp_fermi", _specs("dp_fermi", scope="model"), scalings),
    }


def _numbers(result) -> list:
    """Every number a run returns, in a fixed order (step times aside)."""
    stats = {k: v for k, v in sorted(result.stats.items()) if k not in TIMES}
    return [result.selected, result.steps, sorted(result.releases.items()), result.lam,
            [(k, v.tolist()) for k, v in sorted(result.state_dict.items())],
            [(r.step, r.lam, r.metrics) for r in result.history], repr(stats)]


def _first_difference(a, b, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            found = _first_difference(a[k], b[k], f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def probe(case: str, data, name: str, specs: list[MethodSpec], scalings) -> str:
    module = methods.get(name)
    seeds = [Seeds.from_seed(i) for i in range(len(specs))]
    cons = [constraints.build("dp", n_classes=data.n_classes, n_groups=data.n_groups, gamma=0.02 + 0.03 * i) for i in range(len(specs))]

    def model():
        return models.build("logreg", input_shape=data.input_shape, n_classes=data.n_classes)

    alone = [_numbers(module.fit(data if scalings is None else apply_scaling(data, *scalings[i]), model(), cons[i], specs[i], steps=STEPS,
                                 seeds=seeds[i], device=CPU, reporter=NullReporter()))
             for i in range(len(specs))]
    for order in (list(range(len(specs))), list(range(len(specs)))[::-1]):
        members = [batched.Member(model=model(), constraints=cons[i], spec=specs[i], seeds=seeds[i],
                                  scaling=None if scalings is None else scalings[i]) for i in order]
        for i, result in zip(order, module.fit_many(data, members, steps=STEPS, device=CPU)):
            found = _first_difference(alone[i], _numbers(result))
            if found:
                raise SystemExit(f"{case}: run {i} in a group of {len(order)} (order {order}) differs from itself alone at {found}")
    return hashlib.sha256(repr(alone).encode()).hexdigest()[:16]


def main(argv: list[str]) -> int:
    cases = _cases()
    for case in argv or list(cases):
        print(case, probe(case, *cases[case]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
