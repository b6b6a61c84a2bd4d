"""FedProx (Li et al. 2020): FedAvg whose clients add a proximal term towards the model they receive,
on any tree.

References:
  Li et al., Federated optimization in heterogeneous networks, MLSys 2020.
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.objectives import fedprox_update


@method_over(hierfavg)
def fedprox(host: Host, *, mu: float, name: str = "fedprox") -> FederatedAlgorithm:
  """FedProx with proximal weight ``mu`` on ``topology`` (default flat).

  Args:
    mu: μ >= 0.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``model``,
      ``data``, ``local_optimizer``, ``schedule``, ``topology``, ``server_optimizers``,
      ``cohort_size``, ``sampling``, ``update_paths``, ``systems``, ``personal``, ...);
      ``compute_dtype`` gives mixed-precision local steps.

  Example:
    One round of FedProx (μ = 0.01) over 5 clients:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = fedprox(mu=0.01, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global']
  """
  def objective(s: LocalSetup):
    return fedprox_update(s.model, s.optimizer, mu=mu, batch_size=s.batch_size, max_steps=s.max_steps,
                          compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, name=name)
