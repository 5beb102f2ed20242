"""Non-private evaluation on held-out data: accuracy, per-group rates, constraint gaps."""

from raco_cli.metrics.evaluate import evaluate, fairness_metrics

__all__ = ["evaluate", "fairness_metrics"]
