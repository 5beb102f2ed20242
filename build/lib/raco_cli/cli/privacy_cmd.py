"""``raco privacy``: the accountant as a calculator (no Hydra, no training).

    raco privacy epsilon --steps T --sample-rate q --noise-multiplier s [--hist-noise-multiplier b] --delta d [--sampling shared]
    raco privacy steps   --eps e   --sample-rate q --noise-multiplier s [--hist-noise-multiplier b] --delta d [--sampling shared]

Without ``--hist-noise-multiplier`` the step is DP-SGD's (one Gaussian release).
The number asked for is the last line of the output.
"""

from __future__ import annotations

import argparse
import math
import sys

from raco_cli.cli.args import OneLineParser
from raco_cli.errors import DELTA_RANGE, EPS_RANGE, ConfigError


class _Parser(OneLineParser):
    command = "raco privacy"


def _positive(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number (got {text!r})") from None
        if not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{name} must be > 0 (got {text})")
        return value

    return parse


def _rate(text: str) -> float:
    value = _positive("--sample-rate")(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"--sample-rate must be in (0, 1] (got {text}); it is the Poisson rate q")
    return value


def _count(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer (got {text!r})") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1 (got {text})")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raco privacy", description="Privacy accounting calculator (dp-accounting PLD, add/remove adjacency).")
    sub = p.add_subparsers(dest="what", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("--sample-rate", type=_rate, required=True, help="Poisson sampling rate q = B / n")
    common.add_argument("--noise-multiplier", type=_positive("--noise-multiplier"), required=True, help="Gaussian sigma (std / clip norm)")
    common.add_argument("--hist-noise-multiplier", type=_positive("--hist-noise-multiplier"), default=None,
                        help="Laplace scale of the l1-sensitivity-1 histogram (= 1 / paper's b); omit for DP-SGD")
    common.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    common.add_argument("--sampling", choices=("independent", "shared"), default="independent",
                        help="independent: two Poisson samples per step (default); shared: one for both releases")
    common.add_argument("--discretization", type=_positive("--discretization"), default=1e-4, help="PLD loss grid (default 1e-4)")
    e = sub.add_parser("epsilon", parents=[common], help="epsilon after T steps")
    e.add_argument("--steps", type=_count("--steps"), required=True)
    s = sub.add_parser("steps", parents=[common], help="the largest T within a budget")
    s.add_argument("--eps", type=_positive("--eps"), required=True)
    s.add_argument("--max-steps", type=_count("--max-steps"), default=1_000_000)
    return p


def main(argv: list[str]) -> int:
    from raco_cli.privacy import accountant, events

    args = parser().parse_args(argv)
    if not 0 < args.delta < 1:
        raise ConfigError(DELTA_RANGE.format(value=args.delta))
    from raco_cli.privacy.limits import check_discretization, check_noise

    check_discretization("--discretization", args.discretization)
    check_noise("--noise-multiplier", args.noise_multiplier)
    check_noise("--hist-noise-multiplier", args.hist_noise_multiplier, laplace=True)
    if args.hist_noise_multiplier is None:
        step = events.gaussian_step(sample_rate=args.sample_rate, noise_multiplier=args.noise_multiplier)
    else:
        step = events.raco_step(
            sample_rate=args.sample_rate,
            noise_multiplier=args.noise_multiplier,
            hist_noise_multiplier=args.hist_noise_multiplier,
            sampling=args.sampling,
        )
    print(f"step event: {step}")
    print(f"accountant: dp-accounting PLD (connect-the-dots, pessimistic), discretization {args.discretization:g}, add/remove adjacency")
    if args.what == "epsilon":
        eps = accountant.epsilon(accountant.repeated_event(step, args.steps), args.delta, discretization=args.discretization)
        print(f"epsilon after {args.steps} steps at delta={args.delta:g}:")
        print(f"{eps:.6g}")
    else:
        if not args.eps > 0:
            raise ConfigError(EPS_RANGE.format(value=args.eps))
        budget = accountant.Budget(args.eps, args.delta, args.discretization)
        desc = f"noise_multiplier={args.noise_multiplier}" + (
            f", hist_noise_multiplier={args.hist_noise_multiplier}, sampling={args.sampling}" if args.hist_noise_multiplier else ""
        )
        T = accountant.max_steps(step, budget, limit=args.max_steps, describe=desc, sample_rate=args.sample_rate)
        eps = accountant.epsilon(accountant.repeated_event(step, T), args.delta, discretization=args.discretization)
        print(f"largest number of steps with epsilon <= {args.eps:g} at delta={args.delta:g} (epsilon {eps:.6g}):")
        print(T)
    sys.stdout.flush()
    return 0
