"""kNN-Per (Marfoq et al. 2022): the global model interpolated with a k-nearest-neighbours model over
each client's memory of its features, on any tree.

The memory (``KnnMemory``, ``build_memory``), the kNN model (``knn_probabilities``, ``knn_model``),
the client (``knnper_update``) and the method (``knnper``). The equations and how the authors' code
and FL-bench differ: :doc:`kNN-Per on the mixtures page <algorithms/mixtures.md#knn-per>`.

References:
  Marfoq et al., Personalized federated learning through local memorization, ICML 2022.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup, ScoredModels
from fedtree.core.checks import check_positive, check_unit_interval
from fedtree.core.data import FederatedData
from fedtree.core.local import ClientData, ClientUpdate, sgd_client_update
from fedtree.core.membership import clients_node
from fedtree.core.model import Model, label_kind
from fedtree.core.topology import Topology
from fedtree.core.tuning import default_chunk_size
from fedtree.objectives.fedmmd import last_dense, penultimate

PyTree = Any
PROBABILITY_FLOOR = 1e-12


@struct.dataclass
class KnnMemory:
  """Every client's memory (kNN-Per's datastore).

  Attributes:
    features: ``[C, M, D]`` the features ``φ(x_j)`` of every client's training examples (0 past
      its count), in the params' float dtype.
    labels: ``int32[C, M]`` their labels.
    count: ``int32[C]`` the entries of every client's memory (its training examples).
  """

  features: jax.Array
  labels: jax.Array
  count: jax.Array


def feature_width(model: Model, example_shape) -> int:
  """``D``, the width of the model's features (the input of its last ``nn.Dense``), traced
  abstractly; a ``ValueError`` when its logits are not an ``nn.Dense`` layer's output."""
  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((2,) + tuple(example_shape), jnp.dtype(model.input_dtype))
  found = []

  def probe(p, v):
    layer, feats, _ = last_dense(model, p, v)
    found.append(layer is not None)
    return feats.reshape((feats.shape[0], -1))

  shape = jax.eval_shape(probe, params, x)
  if not found[0]:
    raise ValueError("kNN-Per needs features: the model's logits must be the output of a flax nn.Dense "
                     "layer (its input is the feature φ(x) the memory keeps); this model's are not")
  return int(shape.shape[-1])


def memory_shapes(model: Model, data: FederatedData) -> KnnMemory:
  """The :class:`KnnMemory` of ``data``'s clients as ``ShapeDtypeStruct`` (nothing allocated)."""
  dtype = jnp.result_type(*jax.tree.leaves(jax.eval_shape(model.init, jax.random.key(0))))
  c, m = data.num_clients, int(data.max_train)
  d = feature_width(model, data.example_shape)
  return KnnMemory(features=jax.ShapeDtypeStruct((c, m, d), dtype),
                   labels=jax.ShapeDtypeStruct((c, m), jnp.int32),
                   count=jax.ShapeDtypeStruct((c,), jnp.int32))


def build_memory(model: Model, params: PyTree, owner: jax.Array, data: FederatedData, *,
                 chunk: int | None) -> KnnMemory:
  """Every client's memory under its parent's model ``params[owner[c]]`` (evaluation mode),
  ``chunk`` clients at a time (``None``: all at once); padded or ragged training data."""
  width = int(data.max_train)
  if data.ragged:
    last = data.x_train.shape[0] - 1

    def rows(c):
      idx = jnp.minimum(jnp.take(data.train_offset, c) + jnp.arange(width), last)
      return jnp.take(data.x_train, idx, axis=0), jnp.take(data.y_train, idx, axis=0)
  else:
    def rows(c):
      return data.x_train[c], data.y_train[c]

  def one(cg):
    c, g = cg
    x, y = rows(c)
    feats, _ = penultimate(model, jax.tree.map(lambda a: a[g], params), x)
    real = jnp.arange(width) < jnp.take(data.n_train, c)
    dtype = jnp.result_type(*jax.tree.leaves(params))
    return (jnp.where(real[:, None], feats, 0).astype(dtype), jnp.where(real, y, 0).astype(jnp.int32))

  clients = jnp.arange(data.num_clients, dtype=jnp.int32)
  feats, labels = jax.lax.map(one, (clients, owner), batch_size=chunk)
  return KnnMemory(features=feats, labels=labels, count=jnp.asarray(data.n_train, jnp.int32))


def knn_probabilities(query: jax.Array, memory: KnnMemory, *, k: int, temperature,
                      num_classes: int) -> tuple[jax.Array, jax.Array]:
  """``(p_kNN [B, K], has_memory [])`` of the queries ``[B, D]`` over one client's memory (a
  :class:`KnnMemory` row: ``features [M, D], labels [M], count []``): the ``min(k, count)`` nearest
  entries by squared Euclidean distance, weighted by ``exp(−d² / T)``."""
  feats, labels, count = memory.features, memory.labels, memory.count
  q = query.astype(jnp.promote_types(query.dtype, jnp.float32))
  f = feats.astype(q.dtype)
  d2 = jnp.maximum(jnp.sum(q * q, -1)[:, None] + jnp.sum(f * f, -1)[None, :] - 2.0 * q @ f.T, 0.0)
  real = jnp.arange(feats.shape[0]) < count
  d2 = jnp.where(real[None, :], d2, jnp.inf)
  kk = min(int(k), int(feats.shape[0]))
  neg, idx = jax.lax.top_k(-d2, kk)                                   # nearest first
  ok = jnp.isfinite(neg)
  logits = jnp.where(ok, neg / jnp.asarray(temperature, q.dtype), -jnp.inf)
  w = jax.nn.softmax(jnp.where(ok.any(-1, keepdims=True), logits, 0.0), axis=-1) * ok
  onehot = jax.nn.one_hot(jnp.take(labels, idx), num_classes, dtype=q.dtype)   # [B, k, K]
  return jnp.einsum("bk,bkc->bc", w, onehot), count > 0


def knn_model(model: Model, *, k: int, lam, temperature) -> Model:
  """The model scoring a client: ``apply((params, memory), x)`` is ``log p_m(y | x)``
  (:doc:`docs <algorithms/mixtures.md#knn-per>`)."""

  def apply(params, x, *, train: bool = False, rng=None):
    w, memory = params
    feats, logits = penultimate(model, w, x, train=False)
    p_model = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
    p_knn, has = knn_probabilities(feats, memory, k=k, temperature=temperature,
                                   num_classes=logits.shape[-1])
    lam_ = jnp.asarray(lam, p_model.dtype)
    p = jnp.where(has, lam_ * p_knn.astype(p_model.dtype) + (1 - lam_) * p_model, p_model)
    return jnp.log(jnp.maximum(p, PROBABILITY_FLOOR))

  return model._replace(apply=apply, state=(), apply_train=None)


def knnper_update(model: Model, optimizer, *, batch_size: int, max_steps: int, memory: KnnMemory,
                  compute_dtype=None) -> ClientUpdate:
  """The clients' training: FedAvg's local SGD (:func:`~fedtree.core.local.sgd_client_update`);
  the memory is their state, kept as it is during training (the round rebuilds it afterwards)."""
  plain = sgd_client_update(model, optimizer, batch_size=batch_size, max_steps=max_steps,
                            compute_dtype=compute_dtype)

  def apply(anchor, state, data: ClientData, num_steps, key):
    params, _, loss = plain.apply(anchor, (), data, num_steps, key)
    return params, state, loss

  def init_state(params, num_clients):
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), memory)

  return ClientUpdate(apply=apply, init_state=init_state, model_state=True)


@method_over(hierfavg)
def knnper(
  host: Host,
  *,
  k: int = 10,
  lam: float = 0.5,
  temperature: float = 1.0,
  memory_chunk: int | None = None,
  name: str = "knnper",
) -> FederatedAlgorithm:
  """kNN-Per on ``topology`` (default flat): FedAvg's model, every client scored with
  ``λ p_kNN + (1 − λ) p_w`` over its memory of its examples' features (:doc:`the method's page
  <algorithms/mixtures.md#knn-per>`).

  Args:
    k: neighbours of a query, ``>= 1`` (all of a client's memory when it holds fewer).
    lam: ``λ`` in ``[0, 1]``, the kNN model's weight in the interpolation (0: the global model).
    temperature: ``T > 0`` of the neighbours' weights ``exp(−d² / T)`` (the authors' ``scale`` ``σ``
      is ``T / D``).
    memory_chunk: clients whose memory is built at once at the end of a round (``None``: the
      per-backend default chunk).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`.

  Raises:
    ValueError: ``k`` < 1, ``lam`` outside ``[0, 1]``, ``temperature`` <= 0, ``memory_chunk`` < 1, or a
      model without features (logits not from an ``nn.Dense``) or with token labels.

  Example:
    Two rounds of kNN-Per over 5 clients, 3 neighbours:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(4,))
    >>> alg = knnper(k=3, model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state)), state.client_state.features.shape[::2]
    (['global', 'personal'], (5, 4))
  """
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 1:
    raise ValueError(f"k={k!r} must be an int >= 1 (the neighbours of a query)")
  check_unit_interval(lam=lam)
  check_positive(temperature=temperature)
  if memory_chunk is not None and int(memory_chunk) < 1:
    raise ValueError(f"memory_chunk={memory_chunk} must be >= 1 or None")
  model, data = host["model"], host["data"]
  if model.label_shape:
    raise ValueError(f"{name}: kNN-Per's memory holds one label per example; a model whose labels are "
                     f"{label_kind(model)} (label_shape={model.label_shape}) is not supported")
  shapes = memory_shapes(model, data)
  topology = host.get("topology") or Topology.flat(data.num_clients)
  leaf = topology.depth - 1
  membership = host.get("membership")
  chunk = int(memory_chunk) if memory_chunk is not None else default_chunk_size(data.num_clients)
  scorer = knn_model(model, k=int(k), lam=lam, temperature=temperature)

  def objective(s: LocalSetup):
    if s.optimizer is None:
      raise ValueError(f"{name}: local_optimizer=None, but local training needs one")
    return knnper_update(s.model, s.optimizer, batch_size=s.batch_size, max_steps=s.max_steps,
                         memory=shapes, compute_dtype=s.compute_dtype)

  alg = host.replace(topology=topology).build(client_update=objective, name=name)

  def round_fn(state, data, key):
    state, metrics = alg.round(state, data, key)
    owner = jnp.asarray(clients_node(topology, leaf, membership, state.round), jnp.int32)
    memory = build_memory(model, state.params[leaf], owner, data, chunk=min(chunk, data.num_clients))
    return state.replace(client_state=memory), metrics

  def models(state):
    out = alg.models(state)
    owner = clients_node(topology, leaf, membership, state.round)
    out["personal"] = ScoredModels(params=state.params[leaf], model_of_client=owner,
                                   client_params=state.client_state, model=scorer)
    return out

  # every round rebuilds every client's memory from its training rows: it reads beyond its cohort
  return alg._replace(round=round_fn, models=models, reads=None)
