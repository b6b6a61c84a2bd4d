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

from fedtree.algorithms.hierfavg import hierfavg_method, on_host
from fedtree.algorithms.partial import (
  counts,
  mask_of,
  refuse_personal,
  template_of,
  where_personal,
  with_parameter_counts,
)
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.personal import personal
from fedtree.toolbox.lora import check_adapters

B_PATTERN = r"(^|/)b$"
"""The path pattern of the adapters' ``B`` matrices."""


@hierfavg_method(drops=("personal",))
def fedsa_lora(*, personal_level: int | None = None, name: str = "fedsa_lora", **host) -> FederatedAlgorithm:
  """FedSA-LoRA on ``topology`` (default flat): see the module docstring.

  Args:
    personal_level: ``None``: every client keeps its ``B`` (the paper); ``l``: shared within each
      level-``l`` subtree.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.hierfavg.hierfavg`; ``model`` must be
      adapters on a frozen base (a run's ``adapters`` section).

  Raises:
    ValueError: a model whose parameters are not LoRA adapters, ``personal=``.
  """
  refuse_personal(host, name, "the B matrices are personal; choose where with personal_level=")
  template = template_of(host)
  check_adapters(template, name)
  mask = mask_of((B_PATTERN,), template, algorithm=name)
  alg = on_host(host, personal=personal(B_PATTERN, level=personal_level), name=name)
  return with_parameter_counts(alg, counts(template, mask), where_personal(personal_level))
