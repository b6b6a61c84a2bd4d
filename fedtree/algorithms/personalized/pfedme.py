"""pFedMe (Dinh et al. 2020): personalized models by Moreau envelopes, on any tree.

The client is :func:`fedtree.objectives.pfedme_update`; the equations: :doc:`pFedMe on the
personalization page <algorithms/personalization.md#pfedme>`.

References:
  Dinh, Tran and Nguyen, Personalized federated learning with Moreau envelopes, NeurIPS 2020.
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_positive
from fedtree.objectives.moreau import pfedme_update


@method_over(hierfavg)
def pfedme(
  host: Host,
  *,
  lam: float,
  inner_steps: int,
  personal_lr: float,
  learning_rate: float,
  beta: float = 1.0,
  name: str = "pfedme",
) -> FederatedAlgorithm:
  """pFedMe on ``topology`` (default flat).

  Args:
    lam: λ > 0 of the Moreau envelope.
    inner_steps: K inner steps per local round.
    personal_lr: rate of the inner steps.
    learning_rate: η, the clients' rate of ``w``.
    beta: β > 0, the server's mixing (``β = 1``: FedAvg of the ``w_i``).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`;
      ``server_optimizers`` overrides the default (FedAvg above, ``sgd(β)`` at the leaf parents),
      ``local_optimizer`` is not used (pFedMe's steps are its own), ``compute_dtype`` gives
      mixed-precision inner steps.

  Example:
    One round of pFedMe (λ = 15, K = 2 inner steps):

    >>> common = dict(model=model, data=data, schedule=LocalSchedule(batch_size=8, steps=1))
    >>> alg = pfedme(lam=15.0, inner_steps=2, personal_lr=0.05, learning_rate=0.05, **common)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    [...]
  """
  check_positive(beta=beta)
  host = host.stepping(beta)

  def objective(s: LocalSetup):
    return pfedme_update(s.model, lam=lam, inner_steps=inner_steps, personal_lr=personal_lr,
                         learning_rate=learning_rate, batch_size=s.batch_size, max_steps=s.max_steps,
                         compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, name=name)
