"""The command line (the only module that imports Hydra / OmegaConf)."""
