"""What composing conf/ needs before Hydra runs: resolvers and the project's Hydra plugins."""

from __future__ import annotations

from raco_cli.cli.paths import PROJECT_ROOT
from raco_cli.cores import cpu_count


def register_resolvers() -> None:
    """What composing conf/ needs: the OmegaConf resolvers (``${raco_root:}`` is the project
    directory, ``${raco_cpus:}`` the usable cores), the ``raco`` sweeper's config and the SLURM launcher."""
    from omegaconf import OmegaConf

    from raco_cli.cli import slurm
    from raco_cli.cli.sweeper import register

    if not OmegaConf.has_resolver("raco_root"):
        OmegaConf.register_new_resolver("raco_root", lambda: str(PROJECT_ROOT))
    if not OmegaConf.has_resolver("raco_cpus"):
        OmegaConf.register_new_resolver("raco_cpus", cpu_count)
    register()
    slurm.register()
