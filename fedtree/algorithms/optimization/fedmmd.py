"""FedMMD (Yao et al. 2018): an MMD penalty between the features of the model trained and of the model
received, on any tree (a baseline of FedKWS-UI, paper 002).

References:
  Yao et al., Two-stream federated learning: reduce the communication costs, 2018.
"""

from __future__ import annotations

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.objectives.fedmmd import check_features, fedmmd_update


@method_over(hierfavg)
def fedmmd(
  host: Host,
  *,
  lam: float,
  kernel: str = "gaussian",
  num_kernels: int = 5,
  kernel_mul: float = 2.0,
  bandwidth: float | None = None,
  name: str = "fedmmd",
) -> FederatedAlgorithm:
  """FedMMD with penalty weight ``lam`` on ``topology`` (default flat).

  Args:
    lam: λ >= 0.
    kernel, num_kernels, kernel_mul, bandwidth: the MMD kernel
      (:func:`fedtree.objectives.fedmmd.mmd2`).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`; the model must
      have features (:func:`fedtree.objectives.fedmmd.check_features`); ``compute_dtype`` gives
      mixed-precision local steps.

  Raises:
    ValueError: a bad hyperparameter, or a model without features.

  Example:
    One round of FedMMD (λ = 0.01) over 5 clients with an MLP (features: its hidden layer):

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedmmd(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=1), lam=0.01)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['global']
  """
  check_features(host["model"], host["data"].example_shape)

  def objective(s: LocalSetup):
    return fedmmd_update(s.model, s.optimizer, lam=lam, kernel=kernel, num_kernels=num_kernels,
                         kernel_mul=kernel_mul, bandwidth=bandwidth, batch_size=s.batch_size,
                         max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, name=name)
