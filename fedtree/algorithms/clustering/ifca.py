"""IFCA: the iterative federated clustering algorithm (Ghosh et al. 2020, "An efficient
framework for clustered federated learning", NeurIPS), model-averaging variant; a baseline
of paper 004.

``k`` cluster models, initialized independently (``init="random"``: model ``j`` from
``fold_in(key, j)``, as IFCA's random initialization) or all equal (``init="same"``). One
round: every sampled client computes the loss of all ``k`` models on its whole training data
(masked mean cross-entropy), picks ``ĵ = argmin_j loss_j`` (lowest index on ties), trains
that model locally, and the server averages the trained models per cluster: the cohort's
parent index *is* ``ĵ``, so this is :func:`fedtree.core.tier.train_cohort` followed by a
per-cluster server step (``sgd(1.0)``: FedAvg inside each cluster). A cluster nobody picked
keeps its model. The last pick of every client is kept (``int32[C]``, 0 before its first
round) and is the model it is evaluated with.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.clustering.ops import ClusterState, check_num_clusters
from fedtree.core.algorithm import (
  FederatedAlgorithm,
  NodeModels,
  client_weights,
  initial_params,
  local_training,
)
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.metrics import client_sums
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.server import update_nodes
from fedtree.core.tier import train_cohort

INITS = ("random", "same")


def cluster_losses(model: Model, params, x, y, n, *, batch_size: int | None = None) -> jax.Array:
  """``float32[S, K]``: mean training loss of each of the ``K`` models on each of ``S``
  clients' padded data ``x [S, M, ...]``, ``y [S, M]``, ``n [S]``."""

  def one(args):
    xc, yc, nc = args
    loss, _, count = jax.vmap(lambda p: client_sums(model, p, xc, yc, nc))(params)
    return loss / jnp.maximum(count, 1.0)

  return jax.lax.map(one, (x, y, n), batch_size=batch_size)


def ifca(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  num_clusters: int,
  init: str = "random",
  server_optimizer: optax.GradientTransformation | None = None,
  cohort_size: int | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: Any = None,
  name: str = "ifca",
) -> FederatedAlgorithm:
  """IFCA (module docstring).

  Args:
    model, data, local_optimizer, schedule: as in :func:`fedtree.algorithms.fedavg`.
    num_clusters: ``k``, in ``[1, num_clients]``.
    init: ``"random"`` (independent initial models) or ``"same"``.
    server_optimizer: per-cluster server optimizer (default ``sgd(1.0)``).
    cohort_size, chunk_size, weighting, compute_dtype, name: as in FedAvg.
    client_update: override the local training (a stateless objective that starts from the
      cluster's model; others are refused).
    init_params: the model every cluster starts from (default ``model.init(key)``); needs ``init='same'``.
  """
  num_clients = data.num_clients
  k = check_num_clusters(num_clusters, num_clients)
  if init not in INITS:
    raise ValueError(f"init={init!r}; choose one of {INITS}")
  if init_params is not None and init == "random":
    raise ValueError("ifca: init='random' draws k independent models; with init_params use init='same'")
  client_weights(jnp.zeros(1), weighting)
  opt = optax.sgd(1.0) if server_optimizer is None else server_optimizer
  sampler = cohort_sampler(np.zeros(num_clients, np.int32), cohort_size, chunk_size=chunk_size)
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype, stateless_for="ifca")

  def init_fn(key):
    if init == "random":
      params = jax.vmap(lambda j: model.init(jax.random.fold_in(key, j)))(jnp.arange(k))
    else:
      params = jax.tree.map(lambda p: jnp.broadcast_to(p, (k,) + p.shape),
                          initial_params(model, key, init_params))
    return ClusterState(
      round=jnp.zeros((), jnp.int32), params=params, opt_state=jax.vmap(opt.init)(params),
      cluster_of=jnp.zeros((num_clients,), jnp.int32), num_clusters=jnp.asarray(k, jnp.int32),
    )

  def round_fn(state: ClusterState, data: FederatedData, key):
    w_client = client_weights(data.n_train, weighting)
    cohort = sampler(stream(key, "cohort"))
    losses = cluster_losses(
      model, state.params, jnp.take(data.x_train, cohort.clients, axis=0),
      jnp.take(data.y_train, cohort.clients, axis=0), jnp.take(data.n_train, cohort.clients),
      batch_size=sampler.chunk_size,
    )
    pick = jnp.argmin(losses, axis=1).astype(jnp.int32)
    cohort = cohort._replace(parent=pick)
    res = train_cohort(
      client_update, state.params, cohort, data, num_steps=schedule.num_steps(data.n_train),
      weights=w_client, key=stream(key, "train"), chunk_size=sampler.chunk_size,
    )
    params, opt_state = update_nodes(opt, state.params, state.opt_state, res.pseudo_gradient(),
                                     res.weight_sum > 0)
    slot_client = jnp.where(cohort.valid, cohort.clients, num_clients)
    cluster_of = state.cluster_of.at[slot_client].set(pick, mode="drop")
    metrics = {
      "train_loss": res.loss_sum / jnp.maximum(res.num_trained, 1).astype(jnp.float32),
      "clients_trained": res.num_trained,
      "clusters_picked": jnp.sum((res.weight_sum > 0).astype(jnp.int32)),
    }
    return state.replace(round=state.round + 1, params=params, opt_state=opt_state,
                         cluster_of=cluster_of), metrics

  def models(state: ClusterState):
    cl = np.asarray(state.cluster_of)
    return {"cluster": NodeModels(state.params, cl, cluster_of_client=cl)}

  return FederatedAlgorithm(init=init_fn, round=round_fn, models=models, name=name)
