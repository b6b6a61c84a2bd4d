"""Asynchronous FL on the simulated clock of :mod:`fedtree.toolbox.systems`: FedBuff (the family's
host) and FedAsync (a buffer of one, over FedBuff). Comparisons with the peers' implementations:
``docs/algorithms/asynchronous.md``.
"""

from fedtree.algorithms.asynchronous.fedasync import fedasync
from fedtree.algorithms.asynchronous.fedbuff import fedbuff

__all__ = ["fedasync", "fedbuff"]
