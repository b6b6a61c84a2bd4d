"""FedAMP and HeurFedAMP (Huang et al. 2021): attentive message passing between the clients' personal
models, on any tree.

The attention (``pairwise_sq_distances``, ``pairwise_cosines``, ``attention_weights``), the server
rule (``fedamp_server``), the client (``fedamp_update``) and the method (``fedamp``). The equations
and how PFLlib differs: :doc:`FedAMP on the peers page <algorithms/peers.md#fedamp>`.

References:
  Huang et al., Personalized cross-silo federated learning on non-IID data, AAAI 2021.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.personalized import peers
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, check_positive, is_traced
from fedtree.core.local import (
  ClientData,
  ClientRound,
  ClientUpdate,
  SGDCarry,
  make_sgd_step,
  proximal,
  run_local_steps,
  stack,
)
from fedtree.core.model import Model
from fedtree.core.server_rule import (
  Downlink,
  Inbox,
  Outbox,
  Parcels,
  ServerRule,
  Uplink,
  cohort_blocks,
  slot_rows,
)

PyTree = Any
ATTENTIONS = ("distance", "cosine", "uniform")
STARTS = ("own", "cloud")


def pairwise_sq_distances(blocks: PyTree) -> jax.Array:
  """``[N, B, B]`` squared Euclidean distances between the models of every block (``[N, B, ...]``
  leaves), summed over the leaves; exact differences, one row of every block at a time."""
  leaves = [a.reshape(a.shape[:2] + (-1,)) for a in jax.tree.leaves(blocks)]
  dtype = jnp.result_type(jnp.float32, *leaves)

  def row(i):   # [N, B]: from slot i of every block to all of its slots
    return sum(jnp.sum(jnp.square((a[:, i][:, None, :] - a).astype(dtype)), axis=-1) for a in leaves)

  b = leaves[0].shape[1]
  return jnp.moveaxis(jax.lax.map(row, jnp.arange(b)), 0, 1)


def pairwise_cosines(blocks: PyTree) -> jax.Array:
  """``[N, B, B]`` cosine similarities between the models of every block (a zero model's is 0)."""
  leaves = [a.reshape(a.shape[:2] + (-1,)) for a in jax.tree.leaves(blocks)]
  dtype = jnp.result_type(jnp.float32, *leaves)
  gram = sum(jnp.einsum("nid,njd->nij", a.astype(dtype), a.astype(dtype)) for a in leaves)
  norm = jnp.sqrt(jnp.maximum(jnp.diagonal(gram, axis1=1, axis2=2), 0.0))
  denom = norm[:, :, None] * norm[:, None, :]
  return jnp.where(denom > 0, gram / jnp.where(denom > 0, denom, 1.0), 0.0)


def attention_weights(blocks: PyTree, valid: jax.Array, *, attention: str, alpha, sigma,
                      self_attention) -> jax.Array:
  """``ξ [N, B, B]`` of every block's valid models (``valid [N, B]``): row ``i`` is slot ``i``'s
  weights over its block's slots (0 at invalid ones; see :doc:`docs <algorithms/peers.md#fedamp>`)."""
  b = valid.shape[1]
  eye = jnp.eye(b, dtype=bool)[None]
  pair = valid[:, :, None] & valid[:, None, :]
  others = pair & ~eye
  if attention == "uniform":
    count = jnp.maximum(jnp.sum(valid, axis=1, keepdims=True), 1)
    return jnp.where(pair, 1.0 / count[:, :, None], 0.0)
  if attention == "distance":
    d2 = pairwise_sq_distances(blocks)
    off = jnp.where(others, alpha * jnp.exp(-d2 / sigma) / sigma, 0.0)
    own = 1.0 - jnp.sum(off, axis=2)
  elif attention == "cosine":
    logits = jnp.where(others, sigma * pairwise_cosines(blocks), -jnp.inf)
    peers = jnp.any(others, axis=2)
    soft = jnp.where(others, jax.nn.softmax(jnp.where(peers[:, :, None], logits, 0.0), axis=2), 0.0)
    own = jnp.where(peers, self_attention, 1.0)
    off = (1.0 - own)[:, :, None] * soft
  else:
    raise ValueError(f"attention={attention!r}; choose one of {ATTENTIONS}")
  return jnp.where(eye, jnp.where(valid, own, 0.0)[:, :, None], off)


def fedamp_server(*, attention: str = "distance", alpha=1.0, sigma=1.0, self_attention=0.5,
                  num_parents: int, table: np.ndarray | None = None,
                  rank: np.ndarray | None = None) -> ServerRule:
  """FedAMP's server: every sampled client's cloud model ``u_i`` as its parent (its start; :doc:`docs
  <algorithms/peers.md#fedamp>`), made from the round's start models of its parent's cohort. With
  ``table`` and ``rank`` (:func:`~fedtree.algorithms.personalized.peers.children`) every parent keeps
  the models its children sent (``[N, B, ...]``: what an update path's client stage made of them) and
  pairs those; without, it reads the clients' own models (no client stage: the same models)."""
  if attention not in ATTENTIONS:
    raise ValueError(f"attention={attention!r}; choose one of {ATTENTIONS}")
  holds = table is not None
  if holds and rank is None:
    raise ValueError("fedamp_server: table is given without rank (both: peers.children(topology))")

  def send_each(out: Outbox) -> Parcels:
    if holds:
      w = peers.held_rows(out.state, out.parent, out.clients, rank)                   # [K, ...]
    else:
      w = jax.tree.map(lambda a: jnp.take(a, out.clients, axis=0), out.client_state)
    blocks = cohort_blocks(w, out, num_parents, out.block_size)                      # [N, B, ...]
    valid = cohort_blocks(out.valid, out, num_parents, out.block_size)
    xi = attention_weights(blocks, valid, attention=attention, alpha=alpha, sigma=sigma,
                           self_attention=self_attention)
    cloud = jax.tree.map(lambda a: jnp.einsum("nij,nj...->ni...", xi.astype(a.dtype), a), blocks)
    u = jax.tree.map(lambda c, a: jnp.where(out.valid.reshape((-1,) + (1,) * (a.ndim - 1)), c, a),
                     slot_rows(cloud, out), w)
    own = slot_rows(jnp.diagonal(xi, axis1=1, axis2=2), out)
    count = jnp.maximum(jnp.sum(out.valid), 1)
    return Parcels(start=u, stats={"fedamp_self_weight": jnp.sum(jnp.where(out.valid, own, 0.0)) / count})

  def receive(inbox: Inbox, state):   # the servers hold no model of FedAMP's: theirs stays as it is
    if holds:
      assert inbox.slots is not None
      state = peers.held_receive(state, inbox.slots, rank)
    return jax.tree.map(jnp.zeros_like, inbox.pseudo_gradient), state, {}

  def init(params, n):
    return peers.held_start(params, table) if holds else ()

  return ServerRule(init=init, receive=receive, name="fedamp",
                    down=Downlink(parcels=send_each), up=Uplink(slots=holds))


def fedamp_update(model: Model, optimizer: optax.GradientTransformation, *, lam, alpha, start: str = "own",
                  batch_size: int, max_steps: int, compute_dtype=None) -> ClientUpdate:
  """FedAMP's client: the local steps on ``F_i(w) + (λ / (2 α)) ‖w − u_i‖²`` from its own model (or
  from ``u_i``), ``u_i`` being the model it receives; keeps and sends the result."""
  if start not in STARTS:
    raise ValueError(f"start={start!r}; choose one of {STARTS}")
  step = make_sgd_step(model, optimizer, proximal(lam / alpha), compute_dtype=compute_dtype)

  def apply(cloud, own, data: ClientData, num_steps, key, rnd: ClientRound):
    begin = own if start == "own" else cloud
    carry = SGDCarry(params=begin, opt_state=optimizer.init(begin), anchor=cloud)
    carry, loss = run_local_steps(step, carry, data, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    return carry.params, carry.params, loss, ()

  return ClientUpdate(apply=apply, init_state=stack, starts_from_own_model=start == "own",
                      personal_models=lambda state: state, takes_round=True)


@method_over(hierfavg, drops=("server_optimizers",), cannot=peers.uses_each(
  "the server pairs each client's model with every other's (the attention ξ_ij)"))
def fedamp(
  host: Host,
  *,
  attention: str = "distance",
  alpha: float = 1.0,
  lam: float = 1.0,
  sigma: float = 1.0,
  self_attention: float = 0.5,
  start: str = "own",
  name: str = "fedamp",
) -> FederatedAlgorithm:
  """FedAMP (``attention="distance"``) or HeurFedAMP (``"cosine"``) on ``topology`` (default flat):
  every sampled client receives its cloud model ``u_i = Σ_j ξ_ij w_j``, an attention-weighted
  combination of its cohort's personal models, and trains towards it (:doc:`the method's page
  <algorithms/peers.md#fedamp>`).

  Args:
    attention: ``"distance"`` (FedAMP), ``"cosine"`` (HeurFedAMP) or ``"uniform"``.
    alpha: ``α_k`` > 0, the message-passing step (``"distance"``), also in the proximal coefficient
      ``λ / α_k``.
    lam: ``λ`` >= 0, the weight of the attention function (the proximal term's ``λ / (2 α_k)``).
    sigma: ``σ`` > 0: the distance scale of ``A(x) = 1 − e^{−x/σ}``, or HeurFedAMP's
      similarity scale.
    self_attention: HeurFedAMP's ``ξ_ii`` in ``[0, 1]``.
    start: the local steps start from the client's own model (``"own"``) or its cloud model
      (``"cloud"``).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``cohort_size``,
      ``topology``, ``sampling``, ``systems``, ``local_optimizer``, ...).

  Raises:
    ValueError: an option that does not exist, a hyperparameter out of range, a cohort of fewer than
      2 clients per parent, an update path's stage on the parents' sum (central DP's noise, SecAgg),
      a robust aggregator or a downlink transform (the client stage, local DP and compression, acts
      on every ``u_i − w_i``, :doc:`docs <algorithms/peers.md#fedamp>`), personal parameters, server
      optimizers or a model with BatchNorm statistics.

  Example:
    Two rounds of HeurFedAMP over 5 clients; every client is scored with its own model:

    >>> alg = fedamp(model=model, data=data, local_optimizer=optax.sgd(0.1), attention="cosine",
    ...              schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> sorted(alg.models(state))
    ['personal']
  """
  if attention not in ATTENTIONS:
    raise ValueError(f"{name}: attention={attention!r}; choose one of {ATTENTIONS}")
  if start not in STARTS:
    raise ValueError(f"{name}: start={start!r}; choose one of {STARTS}")
  try:
    check_positive(alpha=alpha, sigma=sigma)
    check_nonnegative(lam=lam, self_attention=self_attention)
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from e
  if not is_traced(self_attention) and float(self_attention) > 1:
    raise ValueError(f"{name}: self_attention={self_attention} is HeurFedAMP's ξ_ii, a weight in [0, 1]")
  cohort = peers.smallest_cohort(host)
  if cohort < 2:
    raise ValueError(f"{name}: a parent samples as few as {cohort} client a round (cohort_size), so FedAMP "
                     f"has no pair to pass messages between; sample at least 2 per parent")
  topology = peers.topology_of(host)
  num_parents = topology.num_nodes(topology.depth - 1)
  table, rank = peers.children(topology) if peers.client_stage(host) else (None, None)
  rule = fedamp_server(attention=attention, alpha=alpha, sigma=sigma, self_attention=self_attention,
                       num_parents=num_parents, table=table, rank=rank)

  def objective(s: LocalSetup):
    return fedamp_update(s.model, s.optimizer, lam=lam, alpha=alpha, start=start, batch_size=s.batch_size,
                         max_steps=s.max_steps, compute_dtype=s.compute_dtype)

  return peers.personal_only(host.build(client_update=objective, server_rule=rule, name=name))
