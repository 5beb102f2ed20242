"""Experiment records: summary.json (always) and MLflow (the only module importing mlflow)."""
