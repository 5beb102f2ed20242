"""Throughput benchmark of the image path (``make bench-celeba``): ResNet16 (GroupNorm) with
RaCO-DP, DP-SGD and non-private SGD on the same device, same code path.

Each method trains for ``--steps`` steps with Poisson batches of expected size ``--batch-size``;
the methods are interleaved over ``--reps`` repetitions (rep 0 warms up and is dropped), so
machine noise hits all alike.  Throughput = training images per second of step time
(evaluation excluded; on CUDA the queued kernels are synchronised before the clock stops).
The last line is ``ratio raco_dp/sgd throughput: <x>`` (the fraction of non-private speed).

Data: the real CelebA (``--dataset celeba``; files under datasets/celeba or the mirror) or,
by default, in-memory generated face-like images (``synthetic_images``), which measures the
model/per-sample-gradient cost without JPEG decoding.

    python -m raco_cli.bench_images [--device auto] [--image-size 32] [--batch-size 32]
        [--steps 2] [--reps 2] [--width 1.0] [--micro-batch 32] [--methods raco_dp,dp_sgd,sgd]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raco_cli.bench_images")
    p.add_argument("--dataset", default="synthetic_images", choices=("synthetic_images", "celeba"))
    p.add_argument("--device", default="auto")
    p.add_argument("--image-size", type=int, default=None, help="S of the (3, S, S) images (default: 128 on CUDA, 32 on CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="expected Poisson batch (default: 256 on CUDA, 32 on CPU)")
    p.add_argument("--steps", type=int, default=None, help="steps per repetition (default: 20 on CUDA, 2 on CPU)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--width", type=float, default=1.0, help="ResNet16 width multiplier (1.0: the paper's 6.4 M parameters)")
    p.add_argument("--micro-batch", type=int, default=None, help="rows per per-sample-gradient chunk (default: 64 on CUDA, 32 on CPU)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--methods", default="raco_dp,dp_sgd,sgd")
    p.add_argument("--baseline", default="sgd")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = p.parse_args(argv)

    import torch

    from raco_cli import constraints, data, methods, models
    from raco_cli.cli.paths import PROJECT_ROOT
    from raco_cli.data import sources
    from raco_cli.methods.base import MethodSpec, NullReporter, Seeds
    from raco_cli.methods.training import resolve_device
    from raco_cli.models.resnet import n_parameters

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    size = args.image_size or (128 if cuda else 32)
    batch = args.batch_size or (256 if cuda else 32)
    steps = args.steps or (20 if cuda else 2)
    micro = args.micro_batch or (64 if cuda else 32)
    if args.dataset == "celeba":
        ds = data.load("celeba", data_dir=Path(os.environ.get("RACO_DATA_DIR", PROJECT_ROOT / "datasets")),
                       mirror=sources.mirror_from_env(), options={"image_size": size})
    else:  # enough rows for q <= 1/4 (n_train is ~64 % of n), a small evaluation set
        ds = data.load("synthetic_images", data_dir=Path("."), options={"n": max(200, int(6.25 * batch)), "size": size, "lazy": False})
    cons = constraints.build("dp", n_classes=ds.n_classes, n_groups=ds.n_groups, gamma=0.05)
    names = args.methods.split(",")
    model = models.build("resnet16", input_shape=ds.input_shape, n_classes=ds.n_classes, options={"width": args.width})
    print(
        f"dataset={args.dataset} image=3x{size}x{size} n_train={len(ds.splits['train'])} params={n_parameters(model)} "
        f"device={device} precision={args.precision} batch={batch} micro_batch={micro} steps={steps} reps={args.reps} "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )
    tput: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(args.reps + 1):  # rep 0 warms up (kernel selection, torch.func tracing)
        for name in names:
            method = methods.get(name.split(":")[0])  # name:secure = the OS CSPRNG (privacy.secure_rng=true)
            private = method.PRIVATE
            spec = MethodSpec(
                name=name.split(":")[0], secure_rng=name.endswith(":secure"), batch_size=batch, steps=steps, eval_every=10**9, micro_batch=micro, precision=args.precision,
                scope="paper", temperature=1.0, lr_dual=0.1, dual="soft", selection="best_feasible",  # (the bench's fixed settings)
                lr=0.2 if private else 0.01,
                clip_norm=1.0 if private else None,
                noise_multiplier=1.2 if private else None,
                hist_noise_multiplier=2.0 if private else None,
            )
            model = models.build("resnet16", input_shape=ds.input_shape, n_classes=ds.n_classes, options={"width": args.width})
            result = method.fit(ds, model, cons, spec, steps=steps, seeds=Seeds.from_seed(rep), device=device, reporter=NullReporter())
            if rep > 0:
                tput[name].append(result.stats["throughput_images_per_s"])
                print(f"  rep {rep} {name:<8} {result.stats['throughput_images_per_s']:.2f} images/s "
                      f"({result.stats['time_per_step_ms']:.0f} ms/step, mean batch {result.stats['mean_batch_size']:.1f})", flush=True)
    for name in names:
        t = tput[name]
        print(f"{name:<8} mean {statistics.mean(t):.2f} images/s  (min {min(t):.2f}, max {max(t):.2f}, reps {len(t)})")
    base = statistics.mean(tput[args.baseline])
    for name in names:
        if name != args.baseline:
            print(f"ratio {name}/{args.baseline} throughput: {statistics.mean(tput[name]) / base:.3f}")
    for name in names:  # the price of secret randomness, method by method
        seeded = name.removesuffix(":secure")
        if name.endswith(":secure") and seeded in tput and seeded != args.baseline:  # else printed above
            print(f"ratio {name}/{seeded} throughput: {statistics.mean(tput[name]) / statistics.mean(tput[seeded]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
