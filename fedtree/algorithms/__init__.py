"""Every algorithm fedtree simulates, re-exported by function name.

Each factory returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm`. Algorithms with
helpers of their own are packages (``bhfl``, ``fedkws``, ``grouppfl``, ``clustering``); the
config -> algorithm path is the experiment layer's (:mod:`fedtree.experiment`).

Only the factories in :data:`SYSTEMS_ALGORITHMS` simulate devices, availability and round
policies (:mod:`fedtree.core.systems`); the others, imported from here, refuse ``systems=``
with a one-line ``ValueError`` naming themselves and those that take it.
"""

from __future__ import annotations

import functools
import inspect

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


def _systems_refused(factory, takers: tuple[str, ...]):
  """``factory``, refusing a ``systems`` argument by name (its signature and docs unchanged)."""

  @functools.wraps(factory)
  def refusing(*args, **kwargs):
    if kwargs.get("systems") is not None:
      raise ValueError(f"{factory.__name__} cannot run systems= (device speeds, availability, round "
                       f"policies: fedtree.core.systems); the algorithms that take it: {list(takers)}")
    return factory(*args, **kwargs)

  return refusing


_FACTORIES = {"awcfl": awcfl, "bhfl": bhfl, "cfl": cfl, "ditto": ditto, "fedavg": fedavg, "fedbuff": fedbuff,
              "fedkws": fedkws, "fedmmd": fedmmd, "fedprox": fedprox, "grouppfl": grouppfl,
              "hierfavg": hierfavg, "ifca": ifca, "mcfl": mcfl, "perfedavg": perfedavg, "pfedme": pfedme,
              "pfedmt": pfedmt}
SYSTEMS_ALGORITHMS = tuple(n for n, f in _FACTORIES.items() if "systems" in inspect.signature(f).parameters)
"""The factories that take ``systems`` (:mod:`fedtree.core.systems`)."""
for _name, _factory in _FACTORIES.items():
  if _name not in SYSTEMS_ALGORITHMS:
    globals()[_name] = _systems_refused(_factory, SYSTEMS_ALGORITHMS)
del _name, _factory

__all__ = [
  "SYSTEMS_ALGORITHMS", "FederatedAlgorithm", "NodeModels", "TreeState",
  "awcfl", "bhfl", "cfl", "ditto", "fedavg",
  "fedbuff", "fedkws", "fedmmd", "fedprox", "grouppfl", "hierfavg", "ifca", "mcfl", "perfedavg", "pfedme",
  "pfedmt",
]
