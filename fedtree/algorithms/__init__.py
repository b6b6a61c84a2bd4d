"""Every algorithm fedtree simulates, re-exported by function name.

Each factory returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm`. Algorithms with
helpers of their own are packages (``bhfl``, ``fedkws``, ``grouppfl``, ``clustering``); the
config -> algorithm path is the experiment layer's (:mod:`fedtree.experiment`).

Only the factories in :data:`SYSTEMS_ALGORITHMS` simulate devices, availability and round
policies (:mod:`fedtree.core.systems`).
"""

from __future__ import annotations

import inspect

from fedtree.algorithms.bhfl import bhfl
from fedtree.algorithms.clustering import awcfl, cfl, ifca, mcfl
from fedtree.algorithms.ditto import ditto
from fedtree.algorithms.fedbabu import fedbabu
from fedtree.algorithms.fedbn import fedbn
from fedtree.algorithms.fedbuff import fedbuff
from fedtree.algorithms.feddyn import feddyn
from fedtree.algorithms.fedkws import fedkws
from fedtree.algorithms.fedmmd import fedmmd
from fedtree.algorithms.fednova import fednova
from fedtree.algorithms.fedper import fedper
from fedtree.algorithms.fedprox import fedprox
from fedtree.algorithms.fedrep import fedrep
from fedtree.algorithms.fedrod import fedrod
from fedtree.algorithms.finetuned import finetuned
from fedtree.algorithms.grouppfl import grouppfl
from fedtree.algorithms.hierfavg import fedavg, hierfavg
from fedtree.algorithms.lgfedavg import lgfedavg
from fedtree.algorithms.local_only import local
from fedtree.algorithms.mime import mime, mimelite
from fedtree.algorithms.perfedavg import perfedavg
from fedtree.algorithms.pfedme import pfedme
from fedtree.algorithms.pfedmt import pfedmt
from fedtree.algorithms.scaffold import scaffold
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, TreeState

_FACTORIES = {"awcfl": awcfl, "bhfl": bhfl, "cfl": cfl, "ditto": ditto, "fedavg": fedavg, "fedbuff": fedbuff,
              "fedkws": fedkws, "fedmmd": fedmmd, "fedprox": fedprox, "grouppfl": grouppfl,
              "hierfavg": hierfavg, "ifca": ifca, "mcfl": mcfl, "perfedavg": perfedavg, "pfedme": pfedme,
              "pfedmt": pfedmt, "scaffold": scaffold,
              "feddyn": feddyn, "fednova": fednova, "mime": mime, "mimelite": mimelite,
              # partial personalization (issue 37)
              "fedper": fedper, "fedrep": fedrep, "lgfedavg": lgfedavg, "fedbn": fedbn, "fedrod": fedrod,
              "fedbabu": fedbabu, "local": local}
SYSTEMS_ALGORITHMS = tuple(n for n, f in _FACTORIES.items() if "systems" in inspect.signature(f).parameters)
"""The factories that take ``systems`` (:mod:`fedtree.core.systems`); a run config that gives
another algorithm a ``systems`` section is refused naming these."""

__all__ = [
  "SYSTEMS_ALGORITHMS", "FederatedAlgorithm", "NodeModels", "TreeState",
  "awcfl", "bhfl", "cfl", "ditto", "fedavg",
  "fedbuff", "fedkws", "fedmmd", "fedprox", "grouppfl", "hierfavg", "ifca", "mcfl", "perfedavg", "pfedme",
  "pfedmt", "scaffold",
  "feddyn", "fednova", "mime", "mimelite",
  "fedbabu", "fedbn", "fedper", "fedrep", "fedrod", "finetuned", "lgfedavg", "local",
]
