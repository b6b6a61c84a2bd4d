"""Local training only: every client trains its own model and never communicates, the lower reference
row of every personalized-FL table.

How it runs and how PFLlib, FL-bench and FLGo differ: :doc:`the partial-personalization page
<algorithms/partial.md#local-training-only>`.
"""

from __future__ import annotations

import jax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import template_of, with_parameter_counts
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.personal import parameter_counts, personal


@method_over(hierfavg, sets={"personal": "every parameter is personal"})
def local(host: Host, *, name: str = "local") -> FederatedAlgorithm:
  """Local training only (:doc:`docs <algorithms/partial.md#local-training-only>`).

  Args:
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``cohort_size``,
      ``local_optimizer``, ``schedule``, ``systems``, ...).

  Raises:
    ValueError: ``personal=`` (every parameter is personal here).

  Example:
    Two rounds of local training over 5 clients: nothing is sent:

    >>> alg = local(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...             schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state, metrics = alg.round(alg.init(jax.random.key(0)), data, jax.random.key(1))
    >>> int(metrics["uplink_bytes"]), sorted(alg.models(state))
    (0, ['personal'])
  """
  template = template_of(host)
  everything = personal(".*")
  alg = host.build(personal=everything, name=name)
  p, _ = parameter_counts(template, jax.tree.map(lambda _: True, template))
  return with_parameter_counts(alg, {"personal": p, "shared": 0}, "personal: per client, never sent")
