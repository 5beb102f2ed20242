"""Figures: Pareto fronts (pure functions) and plots from run records."""
