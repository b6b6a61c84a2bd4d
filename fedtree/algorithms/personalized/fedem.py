"""FedEM (Marfoq et al. 2021): every client's data a mixture of shared components, learned by EM, on any
tree.

The state (``FedEMState``), the E-step (``responsibilities``), the client (``fedem_update``) and the
method (``fedem``). The equations, IFCA as its hard special case and how the authors' code and
FL-bench differ: :doc:`FedEM on the mixtures page <algorithms/mixtures.md#fedem>`.

References:
  Marfoq et al., Federated multi-task learning under a mixture of distributions, NeurIPS 2021
  (Algorithm 1).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup, ScoredModels
from fedtree.core.local import ClientData, ClientUpdate, cast_floating, check_compute_dtype, run_local_steps
from fedtree.core.membership import clients_node
from fedtree.core.model import Model, independent_models, label_kind
from fedtree.core.topology import Topology
from fedtree.toolbox.traffic import model_bytes

PyTree = Any


@struct.dataclass
class FedEMState:
  """FedEM's persistent client state.

  Attributes:
    weights: ``[C, K]`` every client's mixture weights ``π_i`` (the params' float dtype).
  """

  weights: jax.Array


def components_model(model: Model, num_components: int, first: PyTree | None = None) -> Model:
  """The ``K`` components as one model, the host's: ``init`` gives ``[K, ...]`` params (model ``k``
  from ``fold_in(key, k)``; with ``first``, component 0 is ``first``) and ``apply`` the log of their
  uniform mixture (what a node's components predict without a client's weights: e.g.
  power-of-choice sampling's scores)."""

  def init(key):
    params = independent_models(model, key, num_components)
    if first is None:
      return params
    return jax.tree.map(lambda a, f: a.at[0].set(jnp.asarray(f, a.dtype)), params, first)

  def apply(params, x, *, train: bool = False, rng=None):
    logits = jax.vmap(lambda p: model.apply(p, x, train=train, rng=rng))(params)
    logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
    return jax.nn.logsumexp(logp, axis=0) - math.log(num_components)

  return model._replace(init=init, apply=apply, state=(), apply_train=None)


def mixture_model(model: Model) -> Model:
  """The model scoring a client's mixture: ``apply((components [K, ...], π [K]), x)`` is
  ``log Σ_k π_k softmax(h_k(x))``."""

  def apply(params, x, *, train: bool = False, rng=None):
    components, weights = params
    logits = jax.vmap(lambda p: model.apply(p, x, train=train, rng=rng))(components)
    logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
    logw = jnp.log(jnp.asarray(weights, logp.dtype)).reshape((-1,) + (1,) * (logp.ndim - 1))
    return jax.nn.logsumexp(logp + logw, axis=0)

  return model._replace(apply=apply, state=(), apply_train=None)


def _example_nll(model: Model, params, x, y, *, train: bool = False, rng=None):
  """``[K, B]`` per-example cross-entropy of each of the ``K`` components on ``x [B, ...]``."""
  logits = jax.vmap(lambda p: model.apply(p, x, train=train, rng=rng))(params)
  logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)
  return -jnp.take_along_axis(logp, y[None, :, None].astype(jnp.int32), axis=-1)[..., 0]


def responsibilities(model: Model, components, weights, data: ClientData, *, batch_size: int,
                     max_examples: int) -> jax.Array:
  """``[K, W]`` the E-step's posteriors ``q(z_j = k)`` of the client's examples ``j < n`` (0 at the
  padding; ``W = ceil(max_examples / B) · B``): components in evaluation mode, over all its data in
  stored order, ``B`` examples at a time."""
  nb = max(1, -(-int(max_examples) // batch_size))
  k = jnp.shape(weights)[0]
  offset = 0 if data.offset is None else data.offset
  last = data.x.shape[0] - 1

  def body(b, nll):
    pos = b * batch_size + jnp.arange(batch_size)
    rows = jnp.minimum(pos + offset, last)
    x, y = data.x[rows], data.y[rows]
    return jax.lax.dynamic_update_slice(nll, _example_nll(model, components, x, y).astype(nll.dtype),
                                        (0, b * batch_size))

  dtype = jnp.result_type(weights)
  nll = jax.lax.fori_loop(0, nb, body, jnp.zeros((k, nb * batch_size), dtype))
  logq = jnp.log(weights)[:, None] - nll
  q = jax.nn.softmax(logq, axis=0)
  return jnp.where(jnp.arange(nb * batch_size)[None, :] < data.n, q, 0.0)


def fedem_update(model: Model, optimizer: optax.GradientTransformation, *, num_components: int,
                 batch_size: int, max_steps: int, max_examples: int, compute_dtype=None) -> ClientUpdate:
  """FedEM's client (:doc:`docs <algorithms/mixtures.md#fedem>`): E-step, ``π_i`` update, then the ``K``
  components' weighted local steps; the components are sent up, ``π_i`` kept (:class:`FedEMState`).

  Args:
    model: one component's model.
    optimizer: the local optimizer, applied to the stacked ``[K, ...]`` components (an elementwise
      optimizer such as SGD, momentum or Adam is one optimizer per component).
    num_components: ``K``.
    batch_size: minibatch size (the E-step's and the local steps').
    max_steps: static scan length.
    max_examples: the most examples of a client (the E-step's static length).
    compute_dtype: mixed-precision forward and backward passes of the local steps (``None``: the
      params' dtype; the loss and the gradients the optimizer sees stay in the params' dtype).
  """
  k = int(num_components)
  low = check_compute_dtype(compute_dtype)

  def apply(anchor, state: FedEMState, data: ClientData, num_steps, key):
    pi = state.weights
    q = responsibilities(model, anchor, pi, data, batch_size=batch_size, max_examples=max_examples)
    n = data.n.astype(pi.dtype)
    pi = jnp.where(data.n > 0, jnp.sum(q, axis=1) / jnp.maximum(n, 1), pi)
    offset = 0 if data.offset is None else data.offset
    # the minibatches' labels carry the examples' rows, so that a step finds their posteriors
    rows = ClientData(x=data.x, y=jnp.arange(data.x.shape[0], dtype=jnp.int32), n=data.n,
                      cursor=data.cursor, shuffle=data.shuffle, offset=data.offset)

    def loss_fn(components, batch, rng):
      y = jnp.take(data.y, batch.y, axis=0)
      local = jnp.clip(batch.y - offset, 0, q.shape[1] - 1)
      qb = jnp.where(batch.mask[None, :], q[:, local], 0.0)
      nll = _example_nll(model, cast_floating(components, low), cast_floating(batch.x, low), y,
                         train=True, rng=rng).astype(jnp.result_type(pi))
      count = jnp.maximum(jnp.sum(batch.mask), 1).astype(nll.dtype)
      weighted = jnp.sum(qb.astype(nll.dtype) * nll) / count
      logw = jnp.log(pi).astype(nll.dtype)[:, None]
      mix_nll = -jax.nn.logsumexp(logw - nll, axis=0)          # the mixture's loss, reported
      return weighted, jnp.sum(jnp.where(batch.mask, mix_nll, 0.0)) / count

    def step(carry, batch, rng):
      params, opt_state = carry
      (_, loss), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng)
      updates, opt_state = optimizer.update(g, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), loss

    carry, loss = run_local_steps(step, (anchor, optimizer.init(anchor)), rows, num_steps, key,
                                  batch_size=batch_size, max_steps=max_steps)
    return carry[0], FedEMState(weights=pi.astype(state.weights.dtype)), loss

  def init_state(params, num_clients):
    dtype = jnp.result_type(*jax.tree.leaves(params))
    return FedEMState(weights=jnp.full((num_clients, k), 1.0 / k, dtype))

  return ClientUpdate(apply=apply, init_state=init_state)


@method_over(hierfavg, cannot=(
  cannot("model_state", "FedEM's K components would have to mix it; use a model without BatchNorm"),
  cannot("personal", "each client's personal part is its mixture weights π_i"),
))
def fedem(
  host: Host,
  *,
  num_components: int = 3,
  name: str = "fedem",
) -> FederatedAlgorithm:
  """FedEM with ``num_components`` components on ``topology`` (default flat): every client keeps its
  mixture weights ``π_i``, weighs its examples by their posteriors (E-step) and trains all ``K``
  components on its weighted loss (:doc:`the method's page <algorithms/mixtures.md#fedem>`).

  Args:
    num_components: ``K >= 1`` (the paper's experiments use 3).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`
      (``model``: one component's; ``weighting="examples"``, the default, is the paper's
      ``n_i / n``; ``init_params``: the start of component 0, the others starting from independent
      initializations, since ``K`` equal components would never separate).

  Raises:
    ValueError: ``num_components`` < 1, personal parameters, or a model with BatchNorm statistics or
      token labels.

  Example:
    Two rounds of FedEM with 2 components over 5 clients:

    >>> alg = fedem(num_components=2, model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...             schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state)), state.client_state.weights.shape
    (['global', 'personal'], (5, 2))
  """
  if isinstance(num_components, bool) or not isinstance(num_components, (int, np.integer)) \
      or int(num_components) < 1:
    raise ValueError(f"num_components={num_components!r} must be an int >= 1 (K, the mixture's components)")
  k = int(num_components)
  model, data = host["model"], host["data"]
  if model.label_shape:
    raise ValueError(f"{name}: FedEM's E-step weighs examples by their class posteriors; a model whose "
                     f"labels are {label_kind(model)} (label_shape={model.label_shape}) is not supported")
  first = host.get("init_params")   # component 0's start; the others' are independent (equal
  host = host.replace(init_params=None)  # components would never separate: equal posteriors)
  topology = host.get("topology") or Topology.flat(data.num_clients)
  stacked = components_model(model, k, first)

  def objective(s: LocalSetup):
    if s.optimizer is None:
      raise ValueError(f"{name}: local_optimizer=None, but the components' local steps need one")
    return fedem_update(model, s.optimizer, num_components=k, batch_size=s.batch_size,
                        max_steps=s.max_steps, max_examples=int(data.max_train),
                        compute_dtype=s.compute_dtype)

  alg = host.replace(model=stacked, topology=topology).build(client_update=objective, name=name)
  scorer = mixture_model(model)
  leaf = topology.depth - 1
  n = np.asarray(data.n_train, np.float64)
  share = n / max(n.sum(), 1.0)
  one = jax.eval_shape(model.init, jax.random.key(0))
  size = k * model_bytes(one)

  def models(state):
    pi = state.client_state.weights
    owner = clients_node(topology, leaf, host.get("membership"), state.round)
    out = {"personal": ScoredModels(params=state.params[leaf], model_of_client=owner, client_params=pi,
                                    model=scorer)}
    if host.get("top_level", 0) == 0:
      mean = jnp.tensordot(jnp.asarray(share, pi.dtype), pi, axes=1)
      out["global"] = ScoredModels(params=state.params[0],
                                   model_of_client=np.zeros(topology.num_clients, np.int32),
                                   client_params=jnp.broadcast_to(mean, pi.shape), model=scorer)
    return out

  def round_fn(state, data, key):
    state, metrics = alg.round(state, data, key)
    # K models each way on every edge (an update path that compresses reports its own size)
    keys = ["uplink_bytes", "downlink_bytes"] + [f"level{lv}_{d}_bytes" for lv in range(leaf)
                                                for d in ("uplink", "downlink")]
    return state, {**{k_: jnp.asarray(size) for k_ in keys}, **metrics}

  return alg._replace(models=models, round=round_fn)
