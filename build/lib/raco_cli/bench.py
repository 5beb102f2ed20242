"""Step-time benchmark (``make bench``): time per step of each method on the same data.

Runs the methods on Adult with expected batch 512 for a fixed number of steps,
interleaved over repetitions (so machine noise hits all alike), and prints the mean
time per step of each and its ratio to the baseline (``ratio <method>/<baseline>: <x>``).
Evaluation time is excluded (the loops time their steps only).  DPSE is full-batch
(every step uses all training rows), so its step is not a batch-512 step; it is marked.

    python -m raco_cli.bench [--steps 300] [--reps 5] [--batch-size 512] [--methods raco_dp,raco_dp:shared,dp_sgd]
    python -m raco_cli.bench --methods sgd,dp_sgd,raco_dp,dp_fermi,dpse --baseline sgd
    python -m raco_cli.bench --methods raco_dp,raco_dp:secure --baseline raco_dp --batched ""
    python -m raco_cli.bench --methods raco_dp,dp_sgd --batched "" --no-opacus

A ``:secure`` suffix runs the method with its noise and Poisson batches from the OS CSPRNG
(``privacy.secure_rng=true``, the default under scope=model) instead of the seeded PRNG.
A ``:shared`` suffix runs it with ``sampling=shared``: the paper's Algorithm 1, one Poisson
batch for the histogram and the gradient (the paper's Table 2: 0.064 against DP-SGD's 0.037 ms
on Adult, 1.73x). The default methods time both: raco's default, ``sampling=independent``,
draws, gathers and forwards a second Poisson sample every step (its epsilon is smaller at the
same noise, docs/privacy.md). The gap between the two lines is that sample's cost;
``raco_dp:shared`` against ``dp_sgd`` is the histogram's, its noise's and the dual step's
(docs/batched.md).

Batched lines (``--batched 20,160``, on by default; docs/batched.md): the per-run cost of a
step when R runs of the first method are trained as one problem
(:mod:`raco_cli.methods.batched`), ``group step time / R``, against one run of that method
in the same process: ``batched raco_dp R=160: ... ms/step per run = 1/x of one run``.  With a
``:secure`` first method the group draws from the CSPRNG too (the default of a scope=model
sweep): ``python -m raco_cli.bench --methods raco_dp:secure,raco_dp --baseline raco_dp``.

Opacus side by side (``--opacus``, on by default; ``--no-opacus`` turns it off): Opacus'
DP-SGD (:func:`opacus_fit`) on the same Adult training rows and settings as raco's ``dp_sgd``
line (the ``logreg`` model, Poisson batches of expected size ``--batch-size``, noise
multiplier 1, clip norm 1, plain SGD at raco's learning rate, ``--threads`` threads, the same
number of steps), run in the same repetitions loop as raco's methods (warm-up rep excluded):
``opacus_dp_sgd mean X ms/step ...`` and ``ratio opacus_dp_sgd/dp_sgd: Y`` (Y times slower
than raco's DP-SGD).  Without an importable Opacus one line says the comparison was skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

OPACUS = "opacus_dp_sgd"
SUFFIXES = ("secure", "shared")  # method-name suffixes: privacy.secure_rng=true, sampling=shared


def opacus_fit(X, y, *, steps: int, batch_size: int, lr: float, seed: int) -> dict[str, float]:
    """Train Opacus' DP-SGD for ``steps`` steps on rows ``X`` (n, d) float32, labels ``y`` (n,) int64.

    The model is ``models.build("logreg", ...)``'s shape (Flatten, Linear(d, K)), made private
    by ``PrivacyEngine.make_private(poisson_sampling=True)`` from a ``DataLoader`` of
    ``batch_size`` rows (Opacus' sample rate ``1 / len(loader)``, i.e. ``batch_size / n`` up to
    the rounding of ``len``), noise multiplier 1.0, ``max_grad_norm`` 1.0, ``torch.optim.SGD``,
    mean cross-entropy (Opacus divides the noisy sum by the expected batch size, as raco does).

    Timed (wall clock, per step): fetching the Poisson batch from Opacus' ``DPDataLoader``
    (sampling, the dataset's per-row reads and collation: the counterpart of raco's sampling
    and gather), forward, loss, backward with per-sample gradient hooks, and the optimizer
    step (clip, noise, update) and ``zero_grad``.  Not timed: building the model, optimizer,
    DataLoader and ``PrivacyEngine``, and starting a new pass over the loader (``iter``).
    The first step is excluded, as raco's ``time_per_step_ms`` excludes it.

    Returns:
        ``time_per_step_ms``, ``data_ms`` (its batch-fetching part), ``mean_batch_size`` and
        ``sample_rate``.
    """
    import warnings

    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    # Opacus' notices (secure mode off, full backward hooks without input gradients) are not
    # this benchmark's business, and must not become errors under pytest's warning filter
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):  # the global RNG stream is left alone
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)  # the layer's initialisation
        model = nn.Sequential(nn.Flatten(), nn.Linear(X.shape[1], int(y.max()) + 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        loader = DataLoader(TensorDataset(torch.as_tensor(X), torch.as_tensor(y)), batch_size=batch_size,
                            generator=torch.Generator().manual_seed(seed))  # the Poisson sampler's generator
        model, optimizer, loader = PrivacyEngine().make_private(
            module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=True,
            noise_generator=torch.Generator().manual_seed(seed),
        )
        loss_fn = nn.CrossEntropyLoss()
        times: list[float] = []
        data_times: list[float] = []
        rows = 0
        it = iter(loader)
        while len(times) < steps:
            t0 = time.perf_counter()
            try:
                xb, yb = next(it)
            except StopIteration:  # a new pass over the loader: not a step
                it = iter(loader)
                continue
            t1 = time.perf_counter()
            optimizer.zero_grad()
            loss_fn(model(xb), yb).backward()
            optimizer.step()
            times.append(time.perf_counter() - t0)
            data_times.append(t1 - t0)
            rows += len(xb)
    steady = times[1:] or times
    return {
        "time_per_step_ms": 1000 * sum(steady) / len(steady),
        "data_ms": 1000 * sum(data_times[1:] or data_times) / len(steady),
        "mean_batch_size": rows / max(steps, 1),
        "sample_rate": 1 / len(loader),
    }


def opacus_missing() -> str | None:
    """Why Opacus cannot be imported (None when it can)."""
    try:
        import opacus  # noqa: F401
    except Exception as exc:  # not installed, or broken against this torch
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raco_cli.bench")
    p.add_argument("--dataset", default="adult")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--methods", default="raco_dp,raco_dp:shared,dp_sgd")
    p.add_argument("--baseline", default="dp_sgd")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: least noisy)")
    p.add_argument("--batched", default="20,160", help="group sizes R of the batched lines (empty: none)")
    p.add_argument("--opacus", action=argparse.BooleanOptionalAction, default=True,
                   help="time Opacus' DP-SGD on the same rows and settings as dp_sgd (--no-opacus: skip)")
    args = p.parse_args(argv)
    for name in args.methods.split(","):
        bad = [tag for tag in name.split(":")[1:] if tag not in SUFFIXES]
        if bad:
            p.error(f"--methods {name}: unknown suffix :{bad[0]}; allowed: {', '.join(':' + t for t in SUFFIXES)} (e.g. raco_dp:shared)")
    if args.baseline not in args.methods.split(","):  # the ratios divide by it
        p.error(f"--baseline {args.baseline} is not among --methods {args.methods}; add it to --methods or pick one of them")

    import torch

    from raco_cli import constraints, data, methods, models
    from raco_cli.cli.paths import PROJECT_ROOT
    from raco_cli.data import sources
    from raco_cli.methods.base import MethodSpec, NullReporter, Seeds
    from raco_cli.run.train import set_threads

    set_threads(args.threads)  # torch's threads, and numpy's BLAS on one as in raco train

    def spec_of(name: str, private: bool) -> MethodSpec:
        base, *tags = name.split(":")
        # the bench's fixed settings (its timings compare with earlier ones): the paper's scope, tau 1,
        # lr 0.5, the dual step 0.1, the best feasible checkpoint (never evaluated: eval_every)
        return MethodSpec(
            name=base, secure_rng="secure" in tags, sampling="shared" if "shared" in tags else "independent", batch_size=args.batch_size, steps=args.steps, eval_every=10**9,
            scope="paper", lr=0.5, temperature=1.0, lr_dual=0.1, dual="soft", selection="best_feasible",
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
    opacus_why = opacus_missing() if args.opacus else None
    opacus_on = args.opacus and opacus_why is None
    if opacus_on:
        import numpy as np
        import opacus

        train = np.asarray(ds.splits["train"])
        X_op = np.ascontiguousarray(np.asarray(ds.X[train], dtype=np.float32).reshape(len(train), -1))
        X_op[~np.isfinite(X_op).all(axis=1)] = 0.0  # as raco's packed rows (none in Adult)
        y_op = np.asarray(ds.y[train], dtype=np.int64)
        op: dict[str, list[float]] = {"ms": [], "data": [], "batch": []}
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
        if opacus_on:
            r = opacus_fit(X_op, y_op, steps=args.steps, batch_size=args.batch_size, lr=spec_of("dp_sgd", True).lr, seed=rep)
            if rep > 0:
                op["ms"].append(r["time_per_step_ms"])
                op["data"].append(r["data_ms"])
                op["batch"].append(r["mean_batch_size"])
    for name in names:
        t = times[name]
        note = "  [full batch]" if getattr(methods.get(name.split(":")[0]), "FULL_BATCH", False) else ""
        print(f"{name:<10} mean {statistics.mean(t):.4f} ms/step  (median {statistics.median(t):.4f}, min {min(t):.4f}, reps {len(t)}; "
              f"cpu {statistics.mean(cpu[name]):.4f} ms/step with setup){note}")
    base = statistics.mean(times[args.baseline])
    for name in names:
        if name != args.baseline:
            print(f"ratio {name}/{args.baseline}: {statistics.mean(times[name]) / base:.3f}")
    if opacus_on:
        t = op["ms"]
        print(f"{OPACUS:<10} mean {statistics.mean(t):.4f} ms/step  (median {statistics.median(t):.4f}, min {min(t):.4f}, reps {len(t)}; "
              f"DataLoader {statistics.mean(op['data']):.4f} ms/step of it; mean batch {statistics.mean(op['batch']):.1f}; "
              f"opacus {opacus.__version__}, torch {torch.__version__})")
        if "dp_sgd" in times:
            base_op = statistics.mean(times["dp_sgd"])
            print(f"ratio {OPACUS}/dp_sgd: {statistics.mean(t) / base_op:.3f}  "
                  f"({(statistics.mean(t) - statistics.mean(op['data'])) / base_op:.3f} without Opacus' DataLoader time)")
        else:
            print(f"ratio {OPACUS}/dp_sgd: not computed (dp_sgd is not among --methods)")
    elif args.opacus:
        print(f"{OPACUS}: skipped, Opacus cannot be imported ({opacus_why})")
    for name in names:  # the price of secret randomness, method by method
        seeded = name.removesuffix(":secure")
        if name.endswith(":secure") and seeded in times and seeded != args.baseline:  # else printed above
            print(f"ratio {name}/{seeded}: {statistics.mean(times[name]) / statistics.mean(times[seeded]):.3f}")
    sizes = [int(r) for r in args.batched.split(",") if r.strip()]
    first = names[0]
    grouped = methods.get(first.split(":")[0])  # (":secure": the group's noise and batches from the CSPRNG)
    if sizes and hasattr(grouped, "fit_many"):
        from raco_cli.methods.batched import Member

        one, one_cpu = statistics.mean(times[first]), statistics.mean(cpu[first])
        for R in sizes:
            per_run, per_run_cpu = [], []
            for rep in range(2):  # the first warms up
                cons = constraints.build("dp", n_classes=ds.n_classes, n_groups=ds.n_groups, gamma=0.05)
                members = [Member(model=models.build("logreg", input_shape=ds.input_shape, n_classes=ds.n_classes), constraints=cons,
                                  spec=spec_of(first, grouped.PRIVATE), seeds=Seeds.from_seed(1000 * rep + r)) for r in range(R)]
                c0 = time.process_time()
                results = grouped.fit_many(ds, members, steps=args.steps, device=torch.device("cpu"))
                per_run.append(results[0].stats["time_per_step_ms"])
                per_run_cpu.append(1000 * (time.process_time() - c0) / args.steps / R)
            t, c = per_run[-1], per_run_cpu[-1]
            print(f"batched {first} R={R}: {t:.4f} ms/step per run (group step {t * R:.2f} ms) = 1/{one / t:.1f} of one run "
                  f"({one:.4f} ms); cpu {c:.4f} ms/step per run with setup = 1/{one_cpu / c:.1f} of one run ({one_cpu:.4f})")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """:func:`main` with raco's one-line errors (exit 2) for missing data and bad settings."""
    from raco_cli.errors import RacoError

    try:
        return main(argv)
    except RacoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(cli())
