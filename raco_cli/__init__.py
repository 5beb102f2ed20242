"""raco: differentially private learning under rate constraints (RaCO-DP and baselines)."""

__version__ = "0.1.0"
