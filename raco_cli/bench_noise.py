"""Benchmark of ResNet16's secure noise step (``make bench-noise``): the Gaussian noise one
private step adds to the released gradient, one ``gaussian_noise(shape, std, SecureNoise(device))``
per parameter tensor of the ResNet16 raco builds, as the training loops draw it.

Timed in the same run, interleaved over ``--reps`` repetitions (rep 0 warms up and is dropped):

* ``old``: the previous path, ``os.urandom`` on the host, Box-Muller in numpy, then the copy to
  the device (kept here as the reference: :func:`old_gaussian_noise`);
* ``new``: :func:`raco_cli.privacy.mechanisms.gaussian_noise` with a ``SecureNoise`` (on the CPU
  ``os.urandom`` and torch's threaded transcendental ops, on an accelerator a ChaCha20 stream on
  the device);
* ``chacha`` (``--chacha``): ``new`` with its 53-bit integers from a ChaCha20 stream on the
  device even on the CPU (the choice ``SecureNoise`` makes on accelerators), to compare it with
  ``os.urandom`` here;
* ``seeded``: the seeded torch PRNG (``privacy.secure_rng=false``), for scale.

The last lines are ``ratio old/<path>: <x>`` (how many times faster than the old path).  On the
shared 2-core machine (loaded) with ``--threads 1``: old 256, new 140, seeded 29 ms a step
(ratio 1.83); ``--chacha`` at width 0.25: the ChaCha20 path about 6 times the old one (ratio 0.16).  With 2 threads
every path slows down unless ``OMP_WAIT_POLICY=PASSIVE`` (docs/privacy.md, "Cost").

    python -m raco_cli.bench_noise [--device cpu] [--reps 3] [--width 1.0] [--chacha] [--threads N]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time


def old_gaussian_noise(shape, std, device, dtype):
    """The secure Gaussian draw before the ChaCha20 change (numpy on the host), for comparison."""
    import numpy as np
    import torch

    n = math.prod(shape)
    count = 2 * ((n + 1) // 2)
    k = (np.frombuffer(os.urandom(8 * count), dtype=np.uint64) >> np.uint64(11)).astype(np.float64)
    u = ((k + 0.5) * 2.0**-53).reshape(2, count // 2)
    r, angle = np.sqrt(-2.0 * np.log(u[0])), 2.0 * np.pi * u[1]
    z = torch.from_numpy(np.concatenate([r * np.cos(angle), r * np.sin(angle)])[:n]).to(device)
    return (std * z).reshape(shape).to(dtype)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raco_cli.bench_noise")
    p.add_argument("--device", default="auto")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--width", type=float, default=1.0, help="ResNet16 width multiplier (1.0: the paper's 6.4 M parameters)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--chacha", action="store_true", help="also time the ChaCha20 stream on this device (slow on a CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = p.parse_args(argv)

    import torch

    from raco_cli import models
    from raco_cli.methods.training import resolve_device
    from raco_cli.privacy.mechanisms import SecureNoise, gaussian_noise

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model = models.build("resnet16", input_shape=(3, args.image_size, args.image_size), n_classes=2, options={"width": args.width})
    shapes = [tuple(q.shape) for q in model.parameters() if q.requires_grad]
    n = sum(math.prod(s) for s in shapes)
    print(f"ResNet16 width={args.width}: {n} parameters in {len(shapes)} tensors, device={device}, "
          f"threads={torch.get_num_threads()}, reps={args.reps}", flush=True)
    std, dtype = 1.2, torch.float32
    secure = SecureNoise(device)
    chacha = SecureNoise(device, chacha=True)
    seeded = torch.Generator(device=device).manual_seed(0)
    paths = {
        "old": lambda s: old_gaussian_noise(s, std, device, dtype),
        "new": lambda s: gaussian_noise(s, std, secure, dtype=dtype),
        **({"chacha": lambda s: gaussian_noise(s, std, chacha, dtype=dtype)} if args.chacha else {}),
        "seeded": lambda s: gaussian_noise(s, std, seeded, dtype=dtype),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    for rep in range(args.reps + 1):
        for name, draw in paths.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            noise = [draw(s) for s in shapes]
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            assert all(z.device.type == device.type and z.shape == s for z, s in zip(noise, shapes))
            if rep > 0:
                times[name].append(dt)
                print(f"  rep {rep} {name:<7} {dt * 1e3:8.1f} ms", flush=True)
    for name, t in times.items():
        print(f"{name:<7} mean {statistics.mean(t) * 1e3:8.1f} ms/step  (min {min(t) * 1e3:.1f}, max {max(t) * 1e3:.1f})")
    old = statistics.mean(times["old"])
    for name, t in times.items():
        if name != "old":
            print(f"ratio old/{name}: {old / statistics.mean(t):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
