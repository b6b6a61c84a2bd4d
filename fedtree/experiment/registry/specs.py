"""Every algorithm a run config can name (:data:`SPECS`, listed explicitly: no registry filled by
import side effects), a user's own by its ``"module:attribute"`` path (:func:`spec_of`), and the
algorithms that take a capability's section."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from fedtree import algorithms
from fedtree.experiment import capabilities as caps
from fedtree.experiment.capability import Capability
from fedtree.experiment.families import bhfl as bhfl_family
from fedtree.experiment.families import grouppfl as grouppfl_family
from fedtree.experiment.registry.converters import (
  convert_domains,
  convert_public,
  default_learning_rate,
  default_momentum,
  rate_optimizer,
)
from fedtree.experiment.registry.method_memory import (
  fedem_needs,
  knnper_needs,
  message_block_needs,
  pairwise_needs,
)
from fedtree.experiment.spec import AlgorithmSpec, Fields

SPECS: Mapping[str, AlgorithmSpec] = {
  "fedavg": AlgorithmSpec(algorithms.fedavg, takes=("adapters",)),
  "fedopt": AlgorithmSpec(algorithms.fedavg, takes=("adapters",)),
  "hierfavg": AlgorithmSpec(algorithms.hierfavg, takes=("adapters",)),
  "fedbuff": AlgorithmSpec(algorithms.fedbuff),
  "fedprox": AlgorithmSpec(algorithms.fedprox, takes=("adapters",)),
  "fedmmd": AlgorithmSpec(algorithms.fedmmd),
  "ditto": AlgorithmSpec(algorithms.ditto, takes=("adapters",),
                         fields=(rate_optimizer("personal_learning_rate", "personal_optimizer"),)),
  "pfedme": AlgorithmSpec(algorithms.pfedme, defaults=default_learning_rate),
  "perfedavg": AlgorithmSpec(algorithms.perfedavg),
  "pfedmt": AlgorithmSpec(algorithms.pfedmt, defaults=default_learning_rate),
  "bhfl": bhfl_family.SPEC,
  "cfl": AlgorithmSpec(algorithms.cfl),
  "ifca": AlgorithmSpec(algorithms.ifca),
  "awcfl": AlgorithmSpec(algorithms.awcfl),
  "mcfl": AlgorithmSpec(algorithms.mcfl),
  "scaffold": AlgorithmSpec(algorithms.scaffold, takes=("adapters",),
                            memory=message_block_needs("the clients' variate changes Δc_i")),
  "feddyn": AlgorithmSpec(algorithms.feddyn),
  "fednova": AlgorithmSpec(algorithms.fednova, defaults=default_momentum),
  "fedex": AlgorithmSpec(algorithms.fedex),
  "mime": AlgorithmSpec(algorithms.mime),
  "mimelite": AlgorithmSpec(algorithms.mimelite,
                            memory=message_block_needs("the clients' gradients ∇f_i(x)")),
  "moon": AlgorithmSpec(algorithms.moon),
  "qffl": AlgorithmSpec(algorithms.qffl),
  "afl": AlgorithmSpec(algorithms.afl, fields=(Fields(("domains",), convert_domains),)),
  "fedasync": AlgorithmSpec(algorithms.fedasync),
  "apfl": AlgorithmSpec(algorithms.apfl,
                        fields=(rate_optimizer("personal_learning_rate", "personal_optimizer"),)),
  "fedala": AlgorithmSpec(algorithms.fedala),
  "fedem": AlgorithmSpec(algorithms.fedem, memory=fedem_needs),
  "knnper": AlgorithmSpec(algorithms.knnper, memory=knnper_needs),
  "fedamp": AlgorithmSpec(algorithms.fedamp, memory=pairwise_needs("fedamp")),
  "fedfomo": AlgorithmSpec(algorithms.fedfomo, memory=pairwise_needs("fedfomo")),
  "pfedhn": AlgorithmSpec(algorithms.pfedhn, memory=pairwise_needs("pfedhn")),
  "fedproto": AlgorithmSpec(algorithms.fedproto),
  "fedkws": AlgorithmSpec(algorithms.fedkws,
                          fields=(rate_optimizer("private_learning_rate", "private_optimizer"),)),
  "grouppfl": grouppfl_family.SPEC,
  # partial personalization (issue 37)
  "fedper": AlgorithmSpec(algorithms.fedper),
  "fedrep": AlgorithmSpec(algorithms.fedrep),
  "lgfedavg": AlgorithmSpec(algorithms.lgfedavg),
  "fedbn": AlgorithmSpec(algorithms.fedbn),
  "fedrod": AlgorithmSpec(algorithms.fedrod),
  "fedbabu": AlgorithmSpec(algorithms.fedbabu),
  "local": AlgorithmSpec(algorithms.local),
  # methods on LoRA adapters (issue 50): they need the run's adapters section
  "ffa_lora": AlgorithmSpec(algorithms.ffa_lora, takes=("adapters",)),
  "fedsa_lora": AlgorithmSpec(algorithms.fedsa_lora, takes=("adapters",)),
  "hetlora": AlgorithmSpec(algorithms.hetlora, takes=("adapters",)),
  "heterofl": AlgorithmSpec(algorithms.heterofl),
  "fedrolex": AlgorithmSpec(algorithms.fedrolex),
  "fjord": AlgorithmSpec(algorithms.fjord),
  "depthfl": AlgorithmSpec(algorithms.depthfl),
  "feddf": AlgorithmSpec(algorithms.feddf, fields=(Fields(("public_examples", "public_seed"), convert_public,
                                                          targets=("public",)),)),
  "fedmd": AlgorithmSpec(algorithms.fedmd, fields=(Fields(("public_examples", "public_seed"), convert_public,
                                                          targets=("public",)),)),
}


def spec_of(name: str) -> AlgorithmSpec:
  """The spec of algorithm ``name``: a key of :data:`SPECS`, or ``"module:attribute"`` naming a
  factory (or an :class:`AlgorithmSpec`) of the user's own module, imported from ``sys.path``
  (``python -m fedtree.main`` puts the working directory there): its signature is its schema,
  exactly as a built-in factory's (:func:`fedtree.algorithms.host.method.method_over` methods
  included)."""
  if name in SPECS:
    return SPECS[name]
  if not isinstance(name, str) or ":" not in name:
    raise KeyError(name)
  obj = caps.load(name)
  if isinstance(obj, AlgorithmSpec):
    return obj
  if not callable(obj):
    raise ValueError(f"{name!r} is a {type(obj).__name__}, not an algorithm factory nor an AlgorithmSpec")
  return AlgorithmSpec(obj)


def factory_name(name: str) -> str:
  """The ``name`` an algorithm's factory is given for run field ``algorithm=name``: the name
  itself, or the attribute of a ``"module:attribute"`` path."""
  return name.rpartition(":")[2].rpartition(".")[2] if ":" in str(name) else name


def spec_named(label: str, run) -> AlgorithmSpec:
  if "algorithm" not in run:
    raise ValueError(f"config.runs.{label} has no 'algorithm' field; choose one of {sorted(SPECS)} "
                     f"or a factory of your own as 'module:function'")
  try:
    return spec_of(run.algorithm)
  except KeyError:
    near = difflib.get_close_matches(str(run.algorithm).lower(), sorted(SPECS), n=3, cutoff=0.5)
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    raise ValueError(
      f"config.runs.{label}.algorithm={run.algorithm!r} is unknown{hint}; choose one of {sorted(SPECS)} or a "
      f"factory of your own as 'module:function'") from None
  except ValueError as e:
    raise ValueError(f"config.runs.{label}.algorithm: {e}") from e


def algorithms_taking(capability: Capability) -> list[str]:
  """The algorithms of :data:`SPECS` whose runs take ``capability``'s section."""
  return sorted(n for n, spec in SPECS.items() if capability.takes(spec))
