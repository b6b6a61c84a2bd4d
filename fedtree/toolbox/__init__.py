"""The toolbox's in-jit halves, beside the engine: what a capability contributes to a round
(:mod:`fedtree.experiment.capability` declares each capability's host half).

* :mod:`~fedtree.toolbox.accountant`: the privacy spent (ε) and the noise that reaches a target.

Submodules are imported explicitly (``from fedtree.toolbox import accountant``); this package
imports nothing on its own.
"""
