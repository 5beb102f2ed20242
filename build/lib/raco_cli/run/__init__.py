"""The run layer: one run's life, below the command line and above everything it uses.

prepare (:mod:`~raco_cli.run.prepare`: config -> spec -> data, DP preprocessing release,
constraints, model, privacy plan) -> fit (the method) -> finish (:mod:`~raco_cli.run.finish`:
re-account, the released summary, outputs) with its MLflow records
(:mod:`~raco_cli.run.records`), for one run (:mod:`~raco_cli.run.train`) or a sweep group
trained together (:mod:`~raco_cli.run.group`).  Configs enter as plain dicts (the command line
converts Hydra's ``DictConfig``; :func:`~raco_cli.run.spec.plain_config` reads any other mapping),
and nothing here imports the command line, Hydra or OmegaConf; every launcher (single run,
basic/joblib/SLURM sweep jobs, group jobs, ``raco tune``, ``raco audit``) calls these functions,
never another command's module.
"""
