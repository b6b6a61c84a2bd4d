"""Every algorithm fedtree simulates, re-exported by function name.

Each factory returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm`. Algorithms with
helpers of their own are packages (``bhfl``, ``fedkws``, ``grouppfl``, ``clustering``); the
config -> algorithm path is the experiment layer's (:mod:`fedtree.experiment`).
"""

from __future__ import annotations

from fedtree.algorithms.bhfl import bhfl
from fedtree.algorithms.clustering import awcfl, cfl, ifca, mcfl
from fedtree.algorithms.ditto import ditto
from fedtree.algorithms.fedbuff import fedbuff
from fedtree.algorithms.fedkws import fedkws
from fedtree.algorithms.fedmmd import fedmmd
from fedtree.algorithms.fedprox import fedprox
from fedtree.algorithms.grouppfl import grouppfl
from fedtree.algorithms.hierfavg import fedavg, hierfavg
from fedtree.algorithms.perfedavg import perfedavg
from fedtree.algorithms.pfedme import pfedme
from fedtree.algorithms.pfedmt import pfedmt
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, TreeState

__all__ = [
  "FederatedAlgorithm", "NodeModels", "TreeState", "awcfl", "bhfl", "cfl", "ditto", "fedavg",
  "fedbuff", "fedkws", "fedmmd", "fedprox", "grouppfl", "hierfavg", "ifca", "mcfl", "perfedavg", "pfedme",
  "pfedmt",
]
