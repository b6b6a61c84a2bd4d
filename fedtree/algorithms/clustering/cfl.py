"""CFL: clustered federated learning by recursive bipartition (Sattler, Müller & Samek 2020,
"Clustered federated learning: model-agnostic distributed multitask optimization under
privacy constraints", IEEE TNNLS); a baseline of paper 004.

All clients start in one cluster. One round: every sampled client trains from its cluster's
model ``θ_c`` and reports its update ``Δθ_i = θ_i - θ_c`` (flattened). For every cluster
with at least ``min_split_size`` reporting members,

* ``mean_norm = ‖Σ_i p_i Δθ_i‖`` (weighted by ``weighting``), ``max_norm = max_i ‖Δθ_i‖``;
* if ``mean_norm < eps1`` and ``max_norm > eps2`` (the federation is near a stationary
  point of the joint objective but some clients are not: their distributions disagree),
  the cluster's reporting members are split in two by complete-linkage agglomerative
  clustering of the cosine similarities of their updates
  (:func:`fedtree.algorithms.clustering.ops.cosine_bipartition`); the second half moves to a fresh cluster
  slot.

Every cluster (old and new) then aggregates its members' updates onto the model they
started from: ``θ_k ← θ_origin(k) - opt(Σ_i p_i (θ_origin - θ_i))`` (``sgd(1.0)``: FedAvg per
cluster; a new cluster inherits its origin's model and server-optimizer state).

Fixed shapes: there are ``max_clusters`` static slots and ``num_clusters`` (``int32[]``) are
in use; a split is a masked array operation inside the jitted round, every eligible cluster
splits in the same round (lowest ids first) while free slots remain. Choices (marked):
members of a splitting cluster that did not report this round stay in the original cluster
(Sattler et al. assume full participation); Sattler's extra check that the two halves'
cross-similarity is low (``α_max < γ_max``) is left out, ``eps1``/``eps2`` and
``min_split_size`` decide; splitting only starts after ``split_start_round`` rounds.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.clustering.ops import (
  ClusterState,
  check_num_clusters,
  cosine_bipartition,
  cosine_similarity_matrix,
  flatten_rows,
)
from fedtree.core.aggregation import weighted_mean
from fedtree.core.algorithm import (
  FederatedAlgorithm,
  NodeModels,
  client_weights,
  initial_params,
  local_training,
)
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientUpdate, LocalSchedule
from fedtree.core.model import Model
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.server import update_nodes
from fedtree.core.tier import train_cohort


def split_clusters(
  updates: jax.Array, weights: jax.Array, parent: jax.Array, valid: jax.Array, num_clusters: jax.Array, *,
  max_clusters: int, eps1: float, eps2: float, min_split_size: int, allow: jax.Array,
):
  """CFL's split decision for one round, as masked array operations.

  Args:
    updates: ``float32[S, D]`` flattened updates of the cohort slots.
    weights: ``[S]`` aggregation weights (0 for padding).
    parent: ``int32[S]`` cluster each slot trained in.
    valid: ``bool[S]`` real slots.
    num_clusters: ``int32[]`` slots in use.
    max_clusters: static number of slots.
    eps1, eps2, min_split_size: the split criterion.
    allow: ``bool[]``, false to forbid splitting this round.

  Returns:
    ``(new_parent int32[S], origin int32[K], split bool[K], mean_norm [K], max_norm [K])``:
    the cluster of every slot after the splits, the cluster every slot's model comes from
    (itself, or the cluster it was split from), which clusters split, and the norms.
  """
  k = max_clusters
  norms = jnp.linalg.norm(updates, axis=1)
  mean_upd, total = weighted_mean(updates, weights, parent, k)
  mean_norm = jnp.linalg.norm(mean_upd, axis=1)
  max_norm = jax.ops.segment_max(jnp.where(valid, norms, 0.0), parent, num_segments=k)
  size = jax.ops.segment_sum(valid.astype(jnp.int32), parent, num_segments=k)
  ids = jnp.arange(k)
  eligible = (
    allow & (ids < num_clusters) & (size >= min_split_size) & (total > 0)
    & (mean_norm < eps1) & (max_norm > eps2)
  )
  new_id = num_clusters + jnp.cumsum(eligible.astype(jnp.int32)) - 1
  split = eligible & (new_id < k)
  sim = cosine_similarity_matrix(updates)
  second = jax.vmap(lambda c: cosine_bipartition(sim, valid & (parent == c)))(ids)  # [K, S]
  moves = jnp.take(split, parent) & second[parent, jnp.arange(parent.shape[0])]
  new_parent = jnp.where(moves, jnp.take(new_id, parent), parent).astype(jnp.int32)
  origin = ids.at[jnp.where(split, new_id, k)].set(ids, mode="drop").astype(jnp.int32)
  return new_parent, origin, split, mean_norm, max_norm


def cfl(
  *,
  model: Model,
  data: FederatedData,
  local_optimizer: optax.GradientTransformation,
  schedule: LocalSchedule,
  max_clusters: int = 4,
  eps1: float = 0.4,
  eps2: float = 1.6,
  min_split_size: int = 2,
  split_start_round: int = 0,
  server_optimizer: optax.GradientTransformation | None = None,
  cohort_size: int | None = None,
  chunk_size: int | str | None = "auto",
  weighting: str = "examples",
  compute_dtype: str | None = None,
  client_update: ClientUpdate | None = None,
  init_params: Any = None,
  name: str = "cfl",
) -> FederatedAlgorithm:
  """CFL (module docstring).

  Args:
    model, data, local_optimizer, schedule: as in :func:`fedtree.algorithms.fedavg`.
    max_clusters: static number of cluster slots, in ``[1, num_clients]``.
    eps1: split only when the cluster's mean update norm is below this.
    eps2: ... and its largest client update norm is above this.
    min_split_size: reporting members a cluster needs to split (>= 2).
    split_start_round: no split in rounds ``<= split_start_round``.
    server_optimizer: per-cluster server optimizer (default ``sgd(1.0)``).
    cohort_size, chunk_size, weighting, compute_dtype, name: as in FedAvg.
    client_update: override the local training (a stateless objective that starts from the
      cluster's model; others are refused).
    init_params: the model every cluster starts from (default ``model.init(key)``).
  """
  num_clients = data.num_clients
  k = check_num_clusters(max_clusters, num_clients, "max_clusters")
  if not (float(eps1) > 0 and float(eps2) > 0):
    raise ValueError(f"eps1={eps1} and eps2={eps2} must be > 0")
  if int(min_split_size) < 2:
    raise ValueError(f"min_split_size={min_split_size} must be >= 2 (a split needs two halves)")
  if int(split_start_round) < 0:
    raise ValueError(f"split_start_round={split_start_round} must be >= 0")
  client_weights(jnp.zeros(1), weighting)
  opt = optax.sgd(1.0) if server_optimizer is None else server_optimizer
  sampler = cohort_sampler(np.zeros(num_clients, np.int32), cohort_size, chunk_size=chunk_size)
  client_update = local_training(client_update, model, local_optimizer, schedule, data,
                                 compute_dtype=compute_dtype, stateless_for="cfl")

  def init(key):
    params = jax.tree.map(lambda p: jnp.broadcast_to(p, (k,) + p.shape),
                          initial_params(model, key, init_params))
    return ClusterState(
      round=jnp.zeros((), jnp.int32), params=params, opt_state=jax.vmap(opt.init)(params),
      cluster_of=jnp.zeros((num_clients,), jnp.int32), num_clusters=jnp.ones((), jnp.int32),
    )

  def round_fn(state: ClusterState, data: FederatedData, key):
    r = state.round + 1
    w_client = client_weights(data.n_train, weighting)
    cohort = sampler(stream(key, "cohort"))
    cohort = cohort._replace(parent=jnp.take(state.cluster_of, cohort.clients))
    res = train_cohort(
      client_update, state.params, cohort, data, num_steps=schedule.num_steps(data.n_train),
      weights=w_client, key=stream(key, "train"), chunk_size=sampler.chunk_size, keep_client_params=True,
    )
    w = jnp.where(cohort.valid, jnp.take(w_client, cohort.clients), 0.0)
    start = jax.tree.map(lambda p: jnp.take(p, cohort.parent, axis=0), state.params)
    delta = jax.tree.map(jnp.subtract, start, res.client_params)   # θ_c - θ_i = -Δθ_i
    new_parent, origin, split, mean_norm, max_norm = split_clusters(
      flatten_rows(delta), w, cohort.parent, cohort.valid, state.num_clusters, max_clusters=k,
      eps1=float(eps1), eps2=float(eps2), min_split_size=int(min_split_size),
      allow=r > int(split_start_round),
    )
    base = jax.tree.map(lambda p: jnp.take(p, origin, axis=0), state.params)
    base_opt = jax.tree.map(lambda s: jnp.take(s, origin, axis=0), state.opt_state)
    pseudo_grad, total = weighted_mean(delta, w, new_parent, k)
    params, opt_state = update_nodes(opt, base, base_opt, pseudo_grad, total > 0)
    slot_client = jnp.where(cohort.valid, cohort.clients, num_clients)
    cluster_of = state.cluster_of.at[slot_client].set(new_parent, mode="drop")
    in_use = jnp.arange(k) < state.num_clusters
    metrics = {
      "train_loss": res.loss_sum / jnp.maximum(res.num_trained, 1).astype(jnp.float32),
      "clients_trained": res.num_trained,
      "num_clusters": state.num_clusters + jnp.sum(split.astype(jnp.int32)),
      "max_mean_update_norm": jnp.max(jnp.where(in_use, mean_norm, 0.0)),
      "max_update_norm": jnp.max(jnp.where(in_use, max_norm, 0.0)),
    }
    return state.replace(round=r, params=params, opt_state=opt_state, cluster_of=cluster_of,
                         num_clusters=metrics["num_clusters"]), metrics

  def models(state: ClusterState):
    cl = np.asarray(state.cluster_of)
    return {"cluster": NodeModels(state.params, cl, cluster_of_client=cl)}

  return FederatedAlgorithm(init=init, round=round_fn, models=models, name=name)
