"""fedtree: hierarchical, clustered and personalized federated learning, simulated in JAX.

Every client of a tier is a slice of one stacked parameter pytree; a whole tier trains in one
jitted ``vmap``; aggregation is ``segment_sum`` over parent indices; every server node keeps
its own optax optimizer state. See README.md for a tour.

The names below are imported on first use, so ``import fedtree.core.algorithm`` (or any
engine module) imports no algorithm. The packages, from the bottom floor up: ``core`` (the
engine), ``toolbox`` (the capabilities' in-jit halves: privacy, robust aggregation, attacks,
compression, traffic, systems, LoRA), ``models`` / ``objectives`` / ``datasets`` / ``population`` (client
data on disk, paged per-client state), ``algorithms``,
``evaluation``, ``experiment`` (configs, runs, the CLI).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
  "FederatedAlgorithm": "fedtree.core.algorithm", "NodeModels": "fedtree.core.algorithm",
  "TreeState": "fedtree.core.algorithm",
  "Topology": "fedtree.core.topology", "Membership": "fedtree.core.membership",
  "FederatedData": "fedtree.core.data", "as_device": "fedtree.core.data",
  "from_client_arrays": "fedtree.core.data",
  "ClientUpdate": "fedtree.core.local", "LocalSchedule": "fedtree.core.local",
  "proximal": "fedtree.core.local", "sgd_client_update": "fedtree.core.local",
  "Cohort": "fedtree.core.sampling", "cohort_sampler": "fedtree.core.sampling",
  "fedopt": "fedtree.core.server", "server_optimizer": "fedtree.core.server",
  "TierResult": "fedtree.core.tier", "train_cohort": "fedtree.core.tier",
  "EvalStats": "fedtree.core.metrics", "evaluate": "fedtree.core.metrics",
  "summarize": "fedtree.core.metrics",
  "run": "fedtree.core.loop", "NonFiniteLossError": "fedtree.core.loop",
  "Model": "fedtree.core.model", "build_model": "fedtree.models",
  "evaluate_models": "fedtree.evaluation",
  "train_and_evaluate": "fedtree.experiment",
  # every algorithm factory of fedtree.algorithms (its __all__ less the engine's types)
  **{name: "fedtree.algorithms" for name in (
    "afl", "apfl", "awcfl", "bhfl", "cfl", "ditto", "fedala", "fedamp", "fedasync", "fedavg", "fedbabu",
    "fedbn", "fedbuff", "feddyn", "fedem", "fedex", "fedfomo", "fedkws", "fedmmd", "fednova", "fedper",
    "fedproto",
    "fedprox", "fedrep", "fedrod", "finetuned", "grouppfl", "hierfavg", "ifca", "knnper", "lgfedavg",
    "local", "mcfl", "mime", "mimelite", "moon", "perfedavg", "pfedhn", "pfedme", "pfedmt", "qffl",
    "scaffold", "ffa_lora", "fedsa_lora", "hetlora",
  )},
  "load_pretrained": "fedtree.models",
}
_SUBMODULES = (
  "algorithms", "core", "datasets", "evaluation", "experiment", "models", "objectives", "population",
  "toolbox",
)

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str):
  if name in _SUBMODULES:
    return importlib.import_module(f"fedtree.{name}")
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'fedtree' has no attribute {name!r}")


def __dir__():
  return __all__
