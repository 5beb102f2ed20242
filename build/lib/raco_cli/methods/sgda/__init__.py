"""The SGDA family: the stochastic gradient descent-ascent loop of RaCO-DP (:mod:`.core`), the
same loop for a sweep group's runs at once (:mod:`.batched`) and the ERM methods that run on it,
each a switch of its stages (:class:`.core.CoreFlags`): ``raco_dp``, ``dp_sgd``, ``sgd`` and
``sgda`` (whose ``objective=dro`` half runs the DRO family's descent-ascent loop instead).
"""
