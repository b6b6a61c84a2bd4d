"""Local training only: every client trains its own model on its own data and never
communicates, the lower reference row of every personalized-FL table.

Every client starts from the same initial model (``init_params`` or ``model.init``), and each
round every sampled client (``cohort_size``; default every client) takes the local schedule's
steps on its own model, which it keeps. It is the host with **every parameter personal**
(:mod:`fedtree.core.personal`, ``personal(".*")``), so nothing is sent (0 bytes each way), no
server ever moves, and the same options as every other method apply (sampling, systems, the local
optimizer, mixed precision). Each client is scored with its own model (``personal``).

**On a tree** nothing is shared at any level: the tree only groups the clients in reports.

PFLlib's and FL-bench's ``Local`` train every client's own model for the same local epochs per
round; FLGo's ``standalone`` trains each client once for ``num_epochs`` and keeps the epoch of best
validation loss (an early stop on a validation split, not reproduced: fedtree scores the final
model).
"""

from __future__ import annotations

import jax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.partial.split import template_of, with_parameter_counts
from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.personal import parameter_counts, personal


@method_over(hierfavg, sets={"personal": "every parameter is personal"})
def local(host: Host, *, name: str = "local") -> FederatedAlgorithm:
  """Local training only (see the module docstring).

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
