"""A composed job config as the run layer takes it: plain dicts and lists.

Hydra composes OmegaConf ``DictConfig`` objects; OmegaConf stays in the command line, so every
command converts a job config here before it hands it down (``raco train``'s job, a trial of
``raco tune``, ``raco audit``'s run, a lost SLURM job's record, the validation of overrides).
"""

from __future__ import annotations

from typing import Any


def plain_job(cfg: Any) -> dict[str, Any]:
    """``cfg`` (a ``DictConfig``) resolved into plain containers, with string keys at the top.

    Raises:
        omegaconf's errors: an interpolation that does not resolve (callers report them).
    """
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}
