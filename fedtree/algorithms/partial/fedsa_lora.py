"""FedSA-LoRA (Guo et al. 2025, "Selective aggregation for low-rank adaptation in federated
learning") on any tree.

Every client trains both halves of its adapters; only the ``A`` matrices are sent and aggregated
(they learn what is common to the clients), each client keeps its own ``B`` (what is specific to
its data) from round to round: the host's personal parameters (:mod:`fedtree.core.personal`) with
the pattern of the ``B`` matrices. A client is scored with the global ``A`` and its own ``B``
(``personal``); ``B`` is never sent nor counted in bytes, and the update path acts on ``A`` alone.
With ``personal_level=l`` the ``B`` are shared within each level-``l`` subtree instead (one per
edge server).
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import split_model, template_of
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.toolbox.lora import check_adapters

B_PATTERN = r"(^|/)b$"
"""The path pattern of the adapters' ``B`` matrices."""


@method_over(hierfavg, sets={"personal": "the B matrices are personal; choose where with personal_level="})
def fedsa_lora(host: Host, *, personal_level: int | None = None,
               name: str = "fedsa_lora") -> FederatedAlgorithm:
  """FedSA-LoRA on ``topology`` (default flat): see the module docstring.

  Args:
    personal_level: ``None``: every client keeps its ``B`` (the paper); ``l``: shared within each
      level-``l`` subtree.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`; ``model`` must be
      adapters on a frozen base (a run's ``adapters`` section).

  Raises:
    ValueError: a model whose parameters are not LoRA adapters, ``personal=``.

  Example:
    >>> from fedtree.toolbox import lora
    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(16,))
    >>> alg = lora.frozen_base(lambda m: fedsa_lora(model=m, data=data, local_optimizer=optax.sgd(0.1),
    ...                                             schedule=LocalSchedule(batch_size=8, steps=2)),
    ...                        model=model, spec=lora.lora(rank=2), base=model.init(jax.random.key(0)))
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(1))
    >>> sorted(alg.models(state))      # each client's model: the shared A with its own B
    ['personal']
  """
  check_adapters(template_of(host), name)
  split = split_model(host, (B_PATTERN,), algorithm=name, kept="B matrices", shared="A matrices")
  return split.counted(host.build(personal=split.personal(personal_level), name=name), personal_level)
