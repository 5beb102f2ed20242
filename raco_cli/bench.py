"""Step-time benchmark (``make bench``): time per step of each method on the same data.

Runs the methods on Adult with expected batch 512 for a fixed number of steps,
interleaved over repetitions (so machine noise hits all alike), and prints the mean
time per step of each and its ratio to the baseline (``ratio <method>/<baseline>: <x>``).
Evaluation time is excluded (the loops time their steps only).  DPSE is full-batch
(every step uses all training rows), so its step is not a batch-512 step; it is marked.

    python -m raco_cli.bench [--steps 300] [--reps 5] [--batch-size 512] [--methods raco_dp,dp_sgd]
    python -m raco_cli.bench --methods sgd,dp_sgd,raco_dp,dp_fermi,dpse --baseline sgd
    python -m raco_cli.bench --methods raco_dp,raco_dp:secure --baseline raco_dp --batched ""

A ``:secure`` suffix runs the method with its noise and Poisson batches from the OS CSPRNG
(``privacy.secure_rng=true``, the default under scope=model) instead of the seeded PRNG.

Batched lines (``--batched 20,160``, on by default; docs/batched.md): the per-run cost of a
step when R runs of the first method are trained as one problem
(:mod:`raco_cli.methods.batched`), ``group step time / R``, against one run of that method
in the same process: ``batched raco_dp R=160: ... ms/step per run = 1/x of one run``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raco_cli.bench")
    p.add_argument("--dataset", default="adult")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--methods", default="raco_dp,dp_sgd")
    p.add_argument("--baseline", default="dp_sgd")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: least noisy)")
    p.add_argument("--batched", default="20,160", help="group sizes R of the batched lines (empty: none)")
    args = p.parse_args(argv)

    import torch

    from raco_cli import constraints, data, methods, models
    from raco_cli.cli.paths import PROJECT_ROOT
    from raco_cli.data import sources
    from raco_cli.methods.base import MethodSpec, NullReporter, Seeds

    torch.set_num_threads(args.threads)

    def spec_of(name: str, private: bool) -> MethodSpec:
        return MethodSpec(
            name=name.split(":")[0], secure_rng=name.endswith(":secure"), batch_size=args.batch_size, steps=args.steps, eval_every=10**9,
            clip_norm=1.0 if private else None,
            noise_multiplier=1.0 if private else None,
            hist_noise_multiplier=2.0 if private else None,
            options={"lam": 1.0} if name.startswith("dp_fermi") else {},
        )

    ds = data.load(args.dataset, data_dir=Path(os.environ.get("RACO_DATA_DIR", PROJECT_ROOT / "datasets")), mirror=sources.mirror_from_env())
    names = args.methods.split(",")
    for name in names:
        methods.get(name.split(":")[0])  # unknown names fail before any work
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}  # process CPU time per step (whole fit): robust on a loaded machine
    print(f"dataset={args.dataset} n_train={len(ds.splits['train'])} batch={args.batch_size} steps={args.steps} reps={args.reps} threads={args.threads}")
    for rep in range(args.reps + 1):  # rep 0 warms up
        for name in names:
            method = methods.get(name.split(":")[0])
            cons = constraints.build(
                "none" if name.startswith("dpse") else "dp", n_classes=ds.n_classes, n_groups=ds.n_groups, gamma=0.05
            )
            spec = spec_of(name, method.PRIVATE)
            model = models.build("logreg", input_shape=ds.input_shape, n_classes=ds.n_classes)
            c0 = time.process_time()
            result = method.fit(ds, model, cons, spec, steps=args.steps, seeds=Seeds.from_seed(rep), device=torch.device("cpu"), reporter=NullReporter())
            if rep > 0:
                times[name].append(result.stats["time_per_step_ms"])
                cpu[name].append(1000 * (time.process_time() - c0) / args.steps)
    for name in names:
        t = times[name]
        note = "  [full batch]" if getattr(methods.get(name.split(":")[0]), "FULL_BATCH", False) else ""
        print(f"{name:<10} mean {statistics.mean(t):.4f} ms/step  (median {statistics.median(t):.4f}, min {min(t):.4f}, reps {len(t)}; "
              f"cpu {statistics.mean(cpu[name]):.4f} ms/step with setup){note}")
    base = statistics.mean(times[args.baseline])
    for name in names:
        if name != args.baseline:
            print(f"ratio {name}/{args.baseline}: {statistics.mean(times[name]) / base:.3f}")
    for name in names:  # the price of secret randomness, method by method
        seeded = name.removesuffix(":secure")
        if name.endswith(":secure") and seeded in times and seeded != args.baseline:  # else printed above
            print(f"ratio {name}/{seeded}: {statistics.mean(times[name]) / statistics.mean(times[seeded]):.3f}")
    sizes = [int(r) for r in args.batched.split(",") if r.strip()]
    first = names[0]
    if sizes and ":" not in first and hasattr(methods.get(first), "fit_many"):
        from raco_cli.methods.batched import Member

        one, one_cpu = statistics.mean(times[first]), statistics.mean(cpu[first])
        for R in sizes:
            per_run, per_run_cpu = [], []
            for rep in range(2):  # the first warms up
                cons = constraints.build("dp", n_classes=ds.n_classes, n_groups=ds.n_groups, gamma=0.05)
                members = [Member(model=models.build("logreg", input_shape=ds.input_shape, n_classes=ds.n_classes), constraints=cons,
                                  spec=spec_of(first, methods.get(first).PRIVATE), seeds=Seeds.from_seed(1000 * rep + r)) for r in range(R)]
                c0 = time.process_time()
                results = methods.get(first).fit_many(ds, members, steps=args.steps, device=torch.device("cpu"))
                per_run.append(results[0].stats["time_per_step_ms"])
                per_run_cpu.append(1000 * (time.process_time() - c0) / args.steps / R)
            t, c = per_run[-1], per_run_cpu[-1]
            print(f"batched {first} R={R}: {t:.4f} ms/step per run (group step {t * R:.2f} ms) = 1/{one / t:.1f} of one run "
                  f"({one:.4f} ms); cpu {c:.4f} ms/step per run with setup = 1/{one_cpu / c:.1f} of one run ({one_cpu:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
