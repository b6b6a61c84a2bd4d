"""Every algorithm fedtree simulates, re-exported by function name.

Each factory returns a :class:`~fedtree.core.algorithm.FederatedAlgorithm`. The host's parts are
in :mod:`~fedtree.algorithms.host`; the methods are in one folder per family (``optimization``,
``personalized``, ``partial``, ``clustering``, ``hierarchical``, ``asynchronous``,
``heterogeneous``), none importing another family; the config -> algorithm path is the experiment layer's
(:mod:`fedtree.experiment`).

Only the factories in :data:`SYSTEMS_ALGORITHMS` simulate devices, availability and round
policies (:mod:`fedtree.toolbox.systems`).
"""

from __future__ import annotations

import inspect

from fedtree.algorithms.asynchronous import fedasync, fedbuff
from fedtree.algorithms.clustering import awcfl, cfl, ifca, mcfl
from fedtree.algorithms.heterogeneous import depthfl, feddf, fedmd, fedrolex, fjord, heterofl, hetlora
from fedtree.algorithms.hierarchical import bhfl, grouppfl, pfedmt
from fedtree.algorithms.host import hierfavg
from fedtree.algorithms.optimization import (
  afl,
  fedavg,
  feddyn,
  fedex,
  fedkws,
  fedmmd,
  fednova,
  fedprox,
  ffa_lora,
  mime,
  mimelite,
  moon,
  qffl,
  scaffold,
)
from fedtree.algorithms.partial import (
  fedbabu,
  fedbn,
  fedper,
  fedrep,
  fedrod,
  fedsa_lora,
  finetuned,
  lgfedavg,
  local,
)
from fedtree.algorithms.personalized import (
  apfl,
  ditto,
  fedala,
  fedamp,
  fedem,
  fedfomo,
  fedproto,
  knnper,
  perfedavg,
  pfedhn,
  pfedme,
)
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
              "ffa_lora": ffa_lora, "fedsa_lora": fedsa_lora, "hetlora": hetlora,
              # clients with different model widths (issue 51)
              "heterofl": heterofl, "fedrolex": fedrolex, "fjord": fjord, "feddf": feddf,
              "fedmd": fedmd, "depthfl": depthfl,
              # tuning the local learning rate while training (issue 53)
              "fedex": fedex}
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
  "heterofl", "fedrolex", "fjord", "feddf", "fedmd", "depthfl", "fedex",
]
