"""Ditto (Li et al. 2021): FedAvg plus a persistent personal model per client, regularized towards the
model it receives, on any tree.

References:
  Li, Hu, Beirami and Smith, Ditto: fair and robust federated learning through personalization,
  ICML 2021.
"""

from __future__ import annotations

import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.objectives import ditto_update


@method_over(hierfavg)
def ditto(
  host: Host,
  *,
  lam: float,
  personal_optimizer: optax.GradientTransformation | None = None,
  name: str = "ditto",
) -> FederatedAlgorithm:
  """Ditto with regularization ``lam`` (λ >= 0) on ``topology`` (default flat).

  Args:
    lam: Ditto's λ.
    personal_optimizer: optimizer of the personal models (default the local optimizer).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`;
      ``compute_dtype`` gives mixed-precision local steps.

  Example:
    One round of Ditto (λ = 0.1): a global model and a personal model per client:

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = ditto(lam=0.1, local_optimizer=optax.sgd(0.1), **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """

  def objective(s: LocalSetup):
    return ditto_update(s.model, s.optimizer, lam=lam, personal_optimizer=personal_optimizer,
                        batch_size=s.batch_size, max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, name=name)
