"""Training a whole tier of clients in one program, chunk by chunk.

:func:`train_cohort` broadcasts every parent's model to its sampled children
(``take(parent_params, parent_index)``), runs the :class:`~fedtree.local.ClientUpdate` of all
of them with ``vmap``, and sums their weighted pseudo-gradients into their parents with
``segment_sum``. The cohort is processed in chunks by a ``lax.scan`` that accumulates those
sums, so memory grows with the chunk, not the cohort; per-client persistent state is
gathered and scattered back by client index (clients outside the cohort are untouched).

Each client's randomness is ``fold_in(key, client_index)``, so results do not depend on the
chunk size nor on where a client sits in the cohort.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedtree.aggregation import divide_by_weight, weighted_segment_sum
from fedtree.data import FederatedData
from fedtree.local import ClientData, ClientUpdate
from fedtree.sampling import Cohort
from fedtree.sharding import constrain_clients

PyTree = Any


class TierResult(NamedTuple):
  """What a tier sends up.

  Attributes:
    delta_sum: ``[P, ...]`` ``Σ_i w_i (Θ_parent(i) - θ_i)`` over the cohort of each parent.
    weight_sum: ``[P]`` ``Σ_i w_i``; 0 for a parent none of whose children reported.
    client_state: ``[C, ...]`` persistent client state, updated where clients trained.
    client_params: ``[K, ...]`` the trained model of every cohort slot (only with
      ``keep_client_params=True``, else ``None``).
    loss_sum: ``[]`` sum over the cohort of each client's mean local loss.
    num_trained: ``[]`` number of clients that trained.
  """

  delta_sum: PyTree
  weight_sum: jax.Array
  client_state: PyTree
  client_params: PyTree | None
  loss_sum: jax.Array
  num_trained: jax.Array

  def pseudo_gradient(self) -> PyTree:
    """The mean pseudo-gradient ``Θ - Σ p_i θ_i`` of every parent (0 where none reported)."""
    return divide_by_weight(self.delta_sum, self.weight_sum)


def _take(tree: PyTree, idx: jax.Array) -> PyTree:
  return jax.tree.map(lambda a: jnp.take(a, idx, axis=0), tree)


def train_cohort(
  update: ClientUpdate,
  parent_params: PyTree,
  cohort: Cohort,
  data: FederatedData,
  *,
  num_steps: jax.Array,
  weights: jax.Array,
  key: jax.Array,
  client_state: PyTree = (),
  chunk_size: int | None = None,
  anchor_params: PyTree | None = None,
  keep_client_params: bool = False,
) -> TierResult:
  """Trains every client of ``cohort`` from its parent's model and aggregates per parent.

  Args:
    update: the client update, vmapped over each chunk.
    parent_params: stacked ``[P, ...]`` models of the parent nodes.
    cohort: sampled slots (length a multiple of ``chunk_size``).
    data: the federated data (training split is used).
    num_steps: ``int32[C]`` local steps of every client.
    weights: ``[C]`` aggregation weight of every client (examples or ones).
    key: randomness of this tier's round; client ``c`` uses ``fold_in(key, c)``.
    client_state: ``[C, ...]`` persistent per-client state, or ``()``.
    chunk_size: clients trained at once; ``None`` trains the whole cohort in one ``vmap``.
    anchor_params: ``[P, ...]`` models the pseudo-gradient is taken against, when they differ
      from the models clients start from (default ``parent_params``).
    keep_client_params: also return every slot's trained model ``[K, ...]``.
  """
  k = cohort.clients.shape[0]
  chunk = k if chunk_size is None else min(int(chunk_size), k)
  if k % chunk:
    raise ValueError(f"cohort of {k} slots is not a multiple of chunk_size={chunk}")
  num_parents = jax.tree.leaves(parent_params)[0].shape[0]
  num_clients = data.x_train.shape[0]
  anchor_params = parent_params if anchor_params is None else anchor_params
  chunks = jax.tree.map(lambda a: a.reshape((k // chunk, chunk) + a.shape[1:]), cohort)

  def body(carry, ch: Cohort):
    delta_sum, weight_sum, state, loss_sum, count = carry
    # Under a ``jax.set_mesh`` with a ``clients`` axis, each device trains its slice of the
    # chunk (identity otherwise; see fedtree.sharding).
    start = constrain_clients(_take(parent_params, ch.parent))
    cdata = constrain_clients(ClientData(
      x=jnp.take(data.x_train, ch.clients, axis=0),
      y=jnp.take(data.y_train, ch.clients, axis=0),
      n=jnp.take(data.n_train, ch.clients, axis=0),
    ))
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ch.clients)
    params, new_state, loss = jax.vmap(update.apply)(
      start, constrain_clients(_take(state, ch.clients)), cdata, jnp.take(num_steps, ch.clients),
      keys,
    )
    params = constrain_clients(params)
    w = jnp.where(ch.valid, jnp.take(weights, ch.clients).astype(jnp.float32), 0.0)
    anchor = start if anchor_params is parent_params else _take(anchor_params, ch.parent)
    delta = jax.tree.map(jnp.subtract, anchor, params)
    delta_sum = jax.tree.map(
      jnp.add, delta_sum, weighted_segment_sum(delta, w, ch.parent, num_parents)
    )
    weight_sum = weight_sum + jax.ops.segment_sum(w, ch.parent, num_segments=num_parents)
    scatter_idx = jnp.where(ch.valid, ch.clients, num_clients)  # padding slots write nowhere
    state = jax.tree.map(lambda s, v: s.at[scatter_idx].set(v, mode="drop"), state, new_state)
    loss_sum = loss_sum + jnp.sum(jnp.where(ch.valid, loss, 0.0))
    count = count + jnp.sum(ch.valid.astype(jnp.int32))
    return (delta_sum, weight_sum, state, loss_sum, count), (params if keep_client_params else None)

  init = (
    jax.tree.map(lambda p: jnp.zeros_like(p), parent_params),
    jnp.zeros((num_parents,), jnp.float32),
    client_state,
    jnp.zeros((), jnp.float32),
    jnp.zeros((), jnp.int32),
  )
  (delta_sum, weight_sum, state, loss_sum, count), per_chunk = jax.lax.scan(body, init, chunks)
  client_params = None
  if keep_client_params:
    client_params = jax.tree.map(lambda a: a.reshape((k,) + a.shape[2:]), per_chunk)
  return TierResult(delta_sum, weight_sum, state, client_params, loss_sum, count)
