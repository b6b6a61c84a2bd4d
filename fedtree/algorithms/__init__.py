"""Every algorithm fedtree simulates, re-exported by function name.

Each factory returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm`. Algorithms with
helpers of their own are packages (``bhfl``, ``fedkws``, ``grouppfl``, ``clustering``); the
config -> algorithm path is the experiment layer's (:mod:`fedtree.experiment`).

Only the factories in :data:`SYSTEMS_ALGORITHMS` simulate devices, availability and round
policies (:mod:`fedtree.toolbox.systems`).
"""

from __future__ import annotations

import inspect

from fedtree.algorithms.afl import afl
from fedtree.algorithms.apfl import apfl
from fedtree.algorithms.bhfl import bhfl
from fedtree.algorithms.clustering import awcfl, cfl, ifca, mcfl
from fedtree.algorithms.ditto import ditto
from fedtree.algorithms.fedala import fedala
from fedtree.algorithms.fedamp import fedamp
from fedtree.algorithms.fedasync import fedasync
from fedtree.algorithms.fedbabu import fedbabu
from fedtree.algorithms.fedbn import fedbn
from fedtree.algorithms.fedbuff import fedbuff
from fedtree.algorithms.feddyn import feddyn
from fedtree.algorithms.fedem import fedem
from fedtree.algorithms.fedfomo import fedfomo
from fedtree.algorithms.fedkws import fedkws
from fedtree.algorithms.fedmmd import fedmmd
from fedtree.algorithms.fednova import fednova
from fedtree.algorithms.fedper import fedper
from fedtree.algorithms.fedproto import fedproto
from fedtree.algorithms.fedprox import fedprox
from fedtree.algorithms.fedrep import fedrep
from fedtree.algorithms.fedrod import fedrod
from fedtree.algorithms.finetuned import finetuned
from fedtree.algorithms.grouppfl import grouppfl
from fedtree.algorithms.hierfavg import fedavg, hierfavg
from fedtree.algorithms.knnper import knnper
from fedtree.algorithms.lgfedavg import lgfedavg
from fedtree.algorithms.llm import fedsa_lora, ffa_lora, hetlora
from fedtree.algorithms.local_only import local
from fedtree.algorithms.mime import mime, mimelite
from fedtree.algorithms.moon import moon
from fedtree.algorithms.perfedavg import perfedavg
from fedtree.algorithms.pfedhn import pfedhn
from fedtree.algorithms.pfedme import pfedme
from fedtree.algorithms.pfedmt import pfedmt
from fedtree.algorithms.qffl import qffl
from fedtree.algorithms.scaffold import scaffold
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, TreeState

_FACTORIES = {"awcfl": awcfl, "bhfl": bhfl, "cfl": cfl, "ditto": ditto, "fedavg": fedavg, "fedbuff": fedbuff,
              "fedkws": fedkws, "fedmmd": fedmmd, "fedprox": fedprox, "grouppfl": grouppfl,
              "hierfavg": hierfavg, "ifca": ifca, "mcfl": mcfl, "perfedavg": perfedavg, "pfedme": pfedme,
              "pfedmt": pfedmt, "scaffold": scaffold,
              # the optimization baselines (issue 36)
              "feddyn": feddyn, "fednova": fednova, "mime": mime, "mimelite": mimelite,
              "moon": moon, "qffl": qffl, "afl": afl, "fedasync": fedasync,
              # partial personalization (issue 37)
              "fedper": fedper, "fedrep": fedrep, "lgfedavg": lgfedavg, "fedbn": fedbn, "fedrod": fedrod,
              "fedbabu": fedbabu, "local": local,
              # personalized aggregation and mixtures (issue 38)
              "apfl": apfl, "fedala": fedala, "fedem": fedem, "knnper": knnper,
              "fedamp": fedamp, "fedfomo": fedfomo, "pfedhn": pfedhn, "fedproto": fedproto,
              # methods on LoRA adapters (issue 50)
              "ffa_lora": ffa_lora, "fedsa_lora": fedsa_lora, "hetlora": hetlora}
SYSTEMS_ALGORITHMS = tuple(n for n, f in _FACTORIES.items() if "systems" in inspect.signature(f).parameters)
"""The factories that take ``systems`` (:mod:`fedtree.toolbox.systems`); a run config that gives
another algorithm a ``systems`` section is refused naming these."""

__all__ = [
  "SYSTEMS_ALGORITHMS", "FederatedAlgorithm", "NodeModels", "TreeState",
  "awcfl", "bhfl", "cfl", "ditto", "fedavg",
  "fedbuff", "fedkws", "fedmmd", "fedprox", "grouppfl", "hierfavg", "ifca", "mcfl", "perfedavg", "pfedme",
  "pfedmt", "scaffold",
  "feddyn", "fednova", "mime", "mimelite", "moon", "qffl", "afl", "fedasync",
  "fedbabu", "fedbn", "fedper", "fedrep", "fedrod", "finetuned", "lgfedavg", "local",
  "apfl", "fedala", "fedem", "knnper",
  "fedamp", "fedfomo", "pfedhn", "fedproto",
  "ffa_lora", "fedsa_lora", "hetlora",
]
