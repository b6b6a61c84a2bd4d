"""FedALA (Zhang et al. 2023): every client aggregates the global model into its own by learned
element-wise weights, on any tree.

The state (``FedALAState``), the layers adapted (``layer_order``, ``higher_mask``), the client
(``fedala_update``) and the method (``fedala``). The equations and how PFLlib and FL-bench differ:
:doc:`FedALA on the mixtures page <algorithms/mixtures.md#fedala>`.

References:
  Zhang et al., FedALA: Adaptive local aggregation for personalized federated learning, AAAI 2023
  (Algorithm 1).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedtree.algorithms.host import Host, cannot, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, check_positive, is_traced
from fedtree.core.local import (
  Batch,
  ClientData,
  ClientUpdate,
  SGDCarry,
  make_data_loss,
  make_sgd_step,
  run_local_steps,
  shuffled_positions,
  stack,
  steps_per_epoch,
)
from fedtree.core.model import Model, param_paths
from fedtree.core.rng import stream

PyTree = Any


@struct.dataclass
class FedALAState:
  """FedALA's persistent client state.

  Attributes:
    local: ``[C, ...]`` every client's local model ``θ_i``.
    weights: the ALA weights ``W_i`` of the higher layers' leaves, a tuple in leaf order, each
      ``[C, ...]`` shaped as its leaf (ones at the start).
    started: ``bool[C]`` the client has learned ``W_i`` once (its first phase is done).
  """

  local: PyTree
  weights: tuple
  started: jax.Array


def layer_order(model: Model, params: PyTree, example_shape) -> list[str]:
  """The model's layers (a leaf's path without its last name) in the order its forward pass first
  reads one of their parameters (from the ``jaxpr`` of ``model.apply``; ties and unread layers
  by path, last)."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  shapes = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for _, a in flat]
  x = jax.ShapeDtypeStruct((1,) + tuple(example_shape), jnp.dtype(model.input_dtype))
  closed = jax.make_jaxpr(lambda xx, *ls: model.apply(jax.tree.unflatten(treedef, ls), xx))(x, *shapes)
  index = {id(v): i for i, v in enumerate(closed.jaxpr.invars[1:])}
  first: dict[int, int] = {}
  for e, eqn in enumerate(closed.jaxpr.eqns):
    for v in eqn.invars:
      i = index.get(id(v))
      if i is not None and i not in first:
        first[i] = e
  paths = param_paths(params)
  layers: dict[str, float] = {}
  for i, path in enumerate(paths):
    layer = path.rsplit("/", 1)[0] if "/" in path else path
    layers[layer] = min(layers.get(layer, math.inf), first.get(i, math.inf))
  return sorted(layers, key=lambda name: (layers[name], name))


def higher_mask(model: Model, params: PyTree, example_shape, layers: int | None) -> list[bool]:
  """Per leaf of ``params`` (leaf order): whether it belongs to the ``layers`` highest layers
  (:func:`layer_order`; ``None``: every layer)."""
  order = layer_order(model, params, example_shape)
  if layers is None:
    top = set(order)
  else:
    if not 1 <= int(layers) <= len(order):
      raise ValueError(f"layers={layers}: the model has {len(order)} layers {order}; choose 1..{len(order)} "
                       f"or None (every layer)")
    top = set(order[len(order) - int(layers):])
  return [(p.rsplit("/", 1)[0] if "/" in p else p) in top for p in param_paths(params)]


def _subset_batch(key, data: ClientData, j, size, batch_size: int):
  """Batch ``j`` of the client's random subset of ``size`` examples (the first ``size`` of a
  permutation of its ``n`` drawn by ``key``), in that order; rows past ``size`` masked."""
  pos = j * batch_size + jnp.arange(batch_size)
  mask = pos < size
  idx = shuffled_positions(key, jnp.minimum(pos, jnp.maximum(size, 1) - 1), data.n)
  if data.offset is not None:
    idx = idx + data.offset
  x = data.x[idx]
  x = jnp.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))
  y = jnp.where(mask.reshape((-1,) + (1,) * (data.y.ndim - 1)), data.y[idx], 0)
  return Batch(x=x, y=y, mask=mask)


def subset_size(n, fraction):
  """``max(1, floor(s n))`` examples of a client with ``n >= 1`` (0 for none)."""
  m = jnp.floor(jnp.asarray(n).astype(jnp.float32) * fraction).astype(jnp.int32)
  return jnp.where(n > 0, jnp.maximum(m, 1), 0)


def fedala_update(
  model: Model, optimizer: optax.GradientTransformation, *, higher: list[bool], eta: float,
  sample_fraction: float, threshold: float, num_pre_loss: int, max_ala_epochs: int, batch_size: int,
  max_steps: int, max_examples: int, compute_dtype=None,
) -> ClientUpdate:
  """FedALA's client (:doc:`docs <algorithms/mixtures.md#fedala>`): ALA of the received model into the local
  one, then local training of the result, kept and sent.

  Args:
    model: the model.
    optimizer: the local optimizer.
    higher: per leaf (leaf order), whether it is in a higher layer (:func:`higher_mask`).
    eta: ``η``, the ALA weights' step size.
    sample_fraction: ``s``, the fraction of a client's examples ALA learns on, in ``(0, 1]``.
    threshold: the first phase stops when the last ``num_pre_loss`` epoch losses' std is below it.
    num_pre_loss: epoch losses the first phase's stopping rule looks at.
    max_ala_epochs: the most epochs of the first phase.
    batch_size: minibatch size (ALA's and local training's).
    max_steps: static scan length of local training.
    max_examples: the most examples of a client (static ALA batches per epoch).
    compute_dtype: mixed-precision passes (``None``: the params' dtype).
  """
  loss_fn = make_data_loss(model, compute_dtype)
  grad_fn = jax.value_and_grad(loss_fn)
  sgd_step = make_sgd_step(model, optimizer, compute_dtype=compute_dtype)
  batches = max(1, int(steps_per_epoch(max_examples, batch_size)))
  window = int(num_pre_loss)

  def apply(anchor, state: FedALAState, data: ClientData, num_steps, key):
    theta = jax.tree.leaves(state.local)
    glob, treedef = jax.tree.flatten(anchor)
    hi = [i for i, h in enumerate(higher) if h]
    diff = [glob[i] - theta[i] for i in hi]
    base = [theta[i] if higher[i] else glob[i] for i in range(len(glob))]   # lower layers: Θ

    def assemble(w):
      leaves = list(base)
      for k, i in enumerate(hi):
        leaves[i] = theta[i] + diff[k] * w[k]
      return jax.tree.unflatten(treedef, leaves)

    ala_key = stream(key, "ala")
    sub_key, rng_key = jax.random.split(ala_key)
    size = subset_size(data.n, sample_fraction)
    nb = steps_per_epoch(size, batch_size)
    differs = jnp.any(jnp.stack([jnp.any(d != 0) for d in diff])) if diff else jnp.asarray(False)

    def epoch(w, e):
      def body(j, carry):
        w, total = carry
        batch = _subset_batch(sub_key, data, j, size, batch_size)
        rng = jax.random.fold_in(jax.random.fold_in(rng_key, e), j)
        loss, g = grad_fn(assemble(w), batch, rng)
        gl = jax.tree.leaves(g)
        new = [jnp.clip(wk - eta * gl[i] * diff[k], 0.0, 1.0).astype(wk.dtype)
               for k, (i, wk) in enumerate(zip(hi, w, strict=True))]
        on = j < nb
        w = [jnp.where(on, a, b) for a, b in zip(new, w, strict=True)]
        return w, total + jnp.where(on, loss, 0.0).astype(jnp.float32)

      w, total = jax.lax.fori_loop(0, batches, body, (list(w), jnp.zeros((), jnp.float32)))
      return w, total / jnp.maximum(nb, 1).astype(jnp.float32)

    first = ~state.started
    limit = jnp.where(differs & (size > 0), jnp.where(first, max_ala_epochs, 1), 0)

    def cond(c):
      e, _, losses = c
      recent = jnp.arange(max_ala_epochs) >= e - window
      seen = jnp.arange(max_ala_epochs) < e
      sel = recent & seen
      mean = jnp.sum(jnp.where(sel, losses, 0.0)) / window
      std = jnp.sqrt(jnp.sum(jnp.where(sel, (losses - mean) ** 2, 0.0)) / window)
      converged = first & (e > window) & (std < threshold)
      return (e < limit) & ~converged

    def step(c):
      e, w, losses = c
      w, loss = epoch(w, e)
      return e + 1, w, losses.at[jnp.minimum(e, max_ala_epochs - 1)].set(loss)

    init = (jnp.zeros((), jnp.int32), list(state.weights), jnp.zeros((max_ala_epochs,), jnp.float32))
    epochs, w, _ = jax.lax.while_loop(cond, step, init)
    start = assemble(w)
    carry = SGDCarry(params=start, opt_state=optimizer.init(start), anchor=start)
    carry, loss = run_local_steps(sgd_step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    ran = epochs > 0
    return carry.params, FedALAState(local=carry.params, weights=tuple(w), started=state.started | ran), loss

  def init_state(params, num_clients):
    leaves = jax.tree.leaves(params)
    ones = tuple(jnp.ones((num_clients,) + jnp.shape(a), jnp.result_type(a))
                 for a, h in zip(leaves, higher, strict=True) if h)
    return FedALAState(local=stack(params, num_clients), weights=ones,
                       started=jnp.zeros((num_clients,), bool))

  return ClientUpdate(apply=apply, init_state=init_state, personal_models=lambda s: s.local)


@method_over(hierfavg, cannot=(
  cannot("personal", "ALA already decides, element by element, how much of the received model a client "
                     "keeps"),
))
def fedala(
  host: Host,
  *,
  layers: int | None = 1,
  eta: float = 1.0,
  sample_fraction: float = 0.8,
  threshold: float = 0.1,
  num_pre_loss: int = 10,
  max_ala_epochs: int = 100,
  name: str = "fedala",
) -> FederatedAlgorithm:
  """FedALA on ``topology`` (default flat): every client aggregates the received model into its own by
  learned element-wise weights on the higher layers, then trains (:doc:`the method's page
  <algorithms/mixtures.md#fedala>`).

  Args:
    layers: ``p``, the higher layers ALA adapts (the rest take the received model); ``None``: every
      layer (PFLlib's ``layer_idx=0``). PFLlib's default ``layer_idx=2`` (tensors) is ``layers=1``.
    eta: ``η``, the ALA weights' step size (PFLlib's default 1.0).
    sample_fraction: ``s``, the fraction of a client's examples ALA learns on (PFLlib's
      ``rand_percent=80`` is 0.8).
    threshold: the first phase stops when the std of the last ``num_pre_loss`` epoch losses is
      below it (PFLlib's 0.1).
    num_pre_loss: epochs that stopping rule looks at (PFLlib's 10).
    max_ala_epochs: the most epochs of a client's first phase.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``weighting``
      ``"examples"``, the default, is the paper's).

  Raises:
    ValueError: ``layers`` out of range, ``sample_fraction`` outside ``(0, 1]``, a negative ``eta``
      or ``threshold``, ``num_pre_loss`` or ``max_ala_epochs`` < 1, personal parameters, or a model
      with BatchNorm statistics.

  Example:
    Two rounds of FedALA over 5 clients, the last layer adapted:

    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
    >>> alg = fedala(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...              schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state)), [w.shape for w in state.client_state.weights]
    (['global', 'personal'], [(5, 3), (5, 8, 3)])
  """
  check_nonnegative(eta=eta, threshold=threshold)
  check_positive(sample_fraction=sample_fraction)
  if not is_traced(sample_fraction) and float(sample_fraction) > 1:
    raise ValueError(f"sample_fraction={sample_fraction} must be in (0, 1]")
  for field, v in (("num_pre_loss", num_pre_loss), ("max_ala_epochs", max_ala_epochs)):
    if int(v) < 1:
      raise ValueError(f"{field}={v} must be >= 1")
  data, model = host["data"], host["model"]
  template = host.get("init_params")
  if template is None:
    template = jax.eval_shape(model.init, jax.random.key(0))
  higher = higher_mask(model, template, data.example_shape, layers)

  def objective(s: LocalSetup):
    if s.optimizer is None:
      raise ValueError(f"{name}: local_optimizer=None, but local training needs one")
    return fedala_update(s.model, s.optimizer, higher=higher, eta=eta, sample_fraction=sample_fraction,
                         threshold=threshold, num_pre_loss=int(num_pre_loss),
                         max_ala_epochs=int(max_ala_epochs), batch_size=s.batch_size,
                         max_steps=s.max_steps, max_examples=int(data.max_train),
                         compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, name=name)
