"""The DRO family: the methods of the DP-DRO paper and its baselines on the distributionally
robust objective (``objective=dro``, :mod:`raco_cli.objectives.dro`).  Per-record gradient
engines (:mod:`.engine`), the state every DRO loop shares (:mod:`.common`), the SPIDER loops
(:mod:`.spider`), the descent-ascent loops (:mod:`.sgda`) and the five methods built on them with
one idiom (:mod:`.methods`).
"""
