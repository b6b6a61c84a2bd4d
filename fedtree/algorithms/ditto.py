"""Ditto (Li et al. 2021, "Ditto: fair and robust federated learning through
personalization") on any tree.

Each sampled client trains the downloaded model as usual (sent up, aggregated by
:func:`~fedtree.algorithms.hierfavg.hierfavg` under any tree and server optimizers) and its
persistent personal model ``v_i`` on ``f_i(v) + (λ/2)‖v - Θ‖²``
(:func:`fedtree.objectives.ditto_update`). ``v_i`` lives in ``TreeState.client_state`` as
``DittoState.personal [C, ...]``; clients that are not sampled keep theirs untouched.
Models evaluated: the tree's models and ``personal`` (client ``c`` scored with ``v_c``).
"""

from __future__ import annotations

import optax

from fedtree.algorithms.hierfavg import hierfavg
from fedtree.core.algorithm import FederatedAlgorithm, with_personal_models
from fedtree.core.topology import Topology
from fedtree.objectives import ditto_update


def ditto(*, lam: float, topology: Topology | None = None,
          personal_optimizer: optax.GradientTransformation | None = None, name: str = "ditto",
          **hierfavg_kwargs) -> FederatedAlgorithm:
  """Ditto with regularization ``lam`` (λ >= 0) on ``topology`` (default flat).

  Args:
    lam: Ditto's λ.
    topology: the tree (``None``: one server over all clients).
    personal_optimizer: optimizer of the personal models (default the local optimizer).
    name: label for reports.
    **hierfavg_kwargs: as for :func:`~fedtree.algorithms.hierfavg.hierfavg`.
  """
  model, data, schedule = (hierfavg_kwargs[k] for k in ("model", "data", "schedule"))
  topology = Topology.flat(data.num_clients) if topology is None else topology
  update = ditto_update(
    model, hierfavg_kwargs["local_optimizer"], lam=lam, batch_size=schedule.batch_size,
    max_steps=schedule.max_steps(data.max_train), personal_optimizer=personal_optimizer,
  )
  inner = hierfavg(topology=topology, client_update=update, name=name, **hierfavg_kwargs)
  return with_personal_models(inner, "personal", lambda state: state.client_state.personal)
