"""FedFomo (Zhang et al. 2021): every client weights other clients' models by how much they lower its
validation loss per unit of distance, on any tree.

The state and parcel (``FomoState``, ``FomoParcel``), the weights and move (``fomo_weights``,
``fomo_move``), the client (``fomo_update``), the server rule (``fomo_server``) and the method
(``fedfomo``). The equations and how PFLlib and FL-bench differ: :doc:`FedFomo on the peers page
<algorithms/peers.md#fedfomo>`.

References:
  Zhang et al., Personalized federated learning with first order model optimization, ICLR 2021.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.personalized import peers
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, check_positive, is_traced
from fedtree.core.local import (
  ClientData,
  ClientRound,
  ClientUpdate,
  SGDCarry,
  full_loss,
  make_sgd_step,
  run_local_steps,
  shuffled_positions,
)
from fedtree.core.model import Model
from fedtree.core.server_rule import Downlink, Inbox, Outbox, Parcels, ServerRule, Uplink

PyTree = Any
POOLS = ("last_round", "all")
VALIDATIONS = ("random", "last")
SPLIT_SEED = 0x46F30   # the fixed key of the random validation split (folded with the client's index)


@struct.dataclass
class FomoState:
  """A FedFomo client's persistent state.

  Attributes:
    model: ``[C, ...]`` its model ``θ_i``.
    affinity: ``[C, B]`` its row of the server's affinity matrix over its parent's ``B`` children
      (in their index order: :func:`fedtree.algorithms.personalized.peers.children`).
    last: ``int32[C]`` the last round it sent a model (0: never).
  """

  model: PyTree
  affinity: jax.Array
  last: jax.Array


class FomoParcel(struct.PyTreeNode):
  """What a sampled client receives (one slot).

  Attributes:
    models: ``[M, ...]`` the candidate models ``θ_n``.
    position: ``int32[M]`` their positions among the parent's children.
    valid: ``bool[M]`` the candidates that exist (a pool smaller than ``M`` leaves some out).
    round: ``int32[]`` the round.
  """

  models: PyTree
  position: jax.Array
  valid: jax.Array
  round: jax.Array


def validation_split(data: ClientData, *, fraction, how: str, rows: int,
                     key) -> tuple[ClientData, ClientData]:
  """``(train, val)`` of one client's examples: ``⌊fraction · n⌋`` for validation, the rest to train
  on (:doc:`docs <algorithms/peers.md#fedfomo>`); ``rows``: the most examples a client has (static)."""
  n = data.n
  n_val = jnp.floor(fraction * n.astype(jnp.result_type(float))).astype(jnp.int32)
  base = jnp.zeros((), jnp.int32) if data.offset is None else data.offset
  if how == "last":
    val = data._replace(n=n_val, offset=base + n - n_val, cursor=0, shuffle=False)
    return data._replace(n=n - n_val, offset=data.offset), val
  pos = jnp.arange(rows, dtype=jnp.int32)
  perm = jnp.where(pos < n, shuffled_positions(key, pos, jnp.maximum(n, 1)), pos)
  idx = jnp.clip(base + perm, 0, data.x.shape[0] - 1)
  x, y = data.x[idx], data.y[idx]
  val = ClientData(x=x, y=y, n=n_val, cursor=0, shuffle=False, offset=None)
  train = ClientData(x=x, y=y, n=n - n_val, cursor=data.cursor, shuffle=data.shuffle, offset=n_val)
  return train, val


def fomo_weights(model: Model, own: PyTree, candidates: PyTree, valid: jax.Array, val: ClientData, *,
                 batch_size: int) -> jax.Array:
  """``w [M]``: every valid candidate's ``(L(θ_i) − L(θ_n)) / ‖θ_n − θ_i‖`` on ``val`` (0 for a
  candidate equal to ``θ_i``, an invalid one, or no validation example)."""
  loss_own = full_loss(model, own, val, batch_size=batch_size)
  losses = jax.vmap(lambda p: full_loss(model, p, val, batch_size=batch_size))(candidates)
  sq = sum(jnp.sum(jnp.square(c - o[None]).reshape(c.shape[0], int(np.prod(c.shape[1:]))), axis=1)
           for c, o in zip(jax.tree.leaves(candidates), jax.tree.leaves(own), strict=True))
  dist = jnp.sqrt(sq).astype(losses.dtype)
  ok = valid & (dist > 0) & (val.n > 0)
  return jnp.where(ok, (loss_own - losses) / jnp.where(ok, dist, 1.0), 0.0)


def fomo_move(own: PyTree, candidates: PyTree, w: jax.Array) -> PyTree:
  """``θ_i + Σ_n ŵ_n (θ_n − θ_i)``, ``ŵ = max(w, 0) / Σ max(w, 0)`` (``θ_i`` when none is positive)."""
  pos = jnp.maximum(w, 0.0)
  total = jnp.sum(pos)
  share = jnp.where(total > 0, pos / jnp.where(total > 0, total, 1.0), 0.0)
  return jax.tree.map(lambda o, c: o + jnp.tensordot(share.astype(c.dtype), c - o[None], axes=1), own,
                      candidates)


def fomo_update(model: Model, optimizer: optax.GradientTransformation, *, val_fraction, validation: str,
                rows: int, width: int, batch_size: int, max_steps: int, compute_dtype=None,
                validation_data: tuple | None = None) -> ClientUpdate:
  """FedFomo's client (:doc:`docs <algorithms/peers.md#fedfomo>`): weigh the candidates on the validation
  split, move, add the weights to its affinities, train on the rest, keep and send the result. ``rows``: the
  most examples a client has; ``width``: the most children a parent has (its affinity row);
  ``validation_data``: ``(x [C, V, ...], y [C, V], n [C])``, every client's own validation examples
  (then it trains on all its training examples), else a split held out of them."""
  step = make_sgd_step(model, optimizer, compute_dtype=compute_dtype)
  split_key = jax.random.key(SPLIT_SEED)

  def apply(anchor, state: FomoState, data: ClientData, num_steps, key, rnd: ClientRound):
    parcel: FomoParcel = rnd.extra
    if validation_data is None:
      train, val = validation_split(data, fraction=val_fraction, how=validation, rows=rows,
                                    key=jax.random.fold_in(split_key, rnd.client))
    else:   # the data's own validation split: every training example trains
      vx, vy, vn = (jnp.take(a, rnd.client, axis=0) for a in validation_data)
      train, val = data, ClientData(x=vx, y=vy, n=vn, cursor=0, shuffle=False, offset=None)
    w = fomo_weights(model, state.model, parcel.models, parcel.valid, val, batch_size=batch_size)
    begin = fomo_move(state.model, parcel.models, w)
    carry = SGDCarry(params=begin, opt_state=optimizer.init(begin), anchor=begin)
    carry, loss = run_local_steps(step, carry, train, num_steps, key, batch_size=batch_size,
                                  max_steps=max_steps)
    affinity = state.affinity.at[parcel.position].add(w.astype(state.affinity.dtype), mode="drop")
    new = FomoState(model=carry.params, affinity=affinity, last=parcel.round)
    return carry.params, new, loss, ()

  def init_state(params, num_clients):
    dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(params))
    return FomoState(model=jax.tree.map(lambda p: jnp.broadcast_to(p, (num_clients,) + jnp.shape(p)), params),
                     affinity=jnp.zeros((num_clients, width), dtype),
                     last=jnp.zeros((num_clients,), jnp.int32))

  return ClientUpdate(apply=apply, init_state=init_state, personal_models=lambda state: state.model,
                      takes_round=True)


def fomo_server(*, num_candidates: int, epsilon, epsilon_decay, pool: str, table: np.ndarray,
                rank: np.ndarray | None = None) -> ServerRule:
  """FedFomo's server: every sampled client's ``M`` candidates from its parent's other clients
  (:doc:`docs <algorithms/peers.md#fedfomo>`), as its parcel's extra. With ``rank``
  (:func:`~fedtree.algorithms.personalized.peers.children`) every parent keeps the models its children
  sent (``[N, B, ...]``: what an update path's client stage made of them), sends those as candidates
  and takes each client's update against its own copy (the parcel's start); without, the candidates
  are the clients' own models (no client stage: the same models)."""
  if pool not in POOLS:
    raise ValueError(f"pool={pool!r}; choose one of {POOLS}")
  siblings = jnp.asarray(table)                       # [N, B] children, C where none
  m = int(num_candidates)
  holds = rank is not None

  def send_each(out: Outbox) -> Parcels:
    state: FomoState = out.client_state
    c = state.last.shape[0]
    eps = jnp.maximum(epsilon - (out.round - 1).astype(jnp.result_type(float)) * epsilon_decay, 0.0)

    def pick(client, parent, key):
      mates = siblings[parent]                          # [B]
      ok = (mates < c) & (mates != client)
      if pool == "last_round":
        ok = ok & (jnp.take(state.last, jnp.minimum(mates, c - 1)) == out.round - 1)
      k_explore, k_tie = jax.random.split(key)
      explore = jax.random.uniform(k_explore) < eps
      tie = jax.random.uniform(k_tie, mates.shape)
      score = jnp.where(explore, tie, state.affinity[client])
      order = jnp.lexsort((tie, jnp.where(ok, -score, jnp.inf)))[:m]
      return order.astype(jnp.int32), ok[order], jnp.minimum(mates[order], c - 1)

    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(out.key, out.clients)
    position, valid, ids = jax.vmap(pick)(out.clients, out.parent, keys)   # [K, M]
    if holds:   # the parent's copies: a candidate's row at its position among the siblings
      rows = jnp.clip(out.parent, 0, jax.tree.leaves(out.state)[0].shape[0] - 1)[:, None]
      models = jax.tree.map(lambda a: a[rows, position], out.state)       # [K, M, ...]
    else:
      models = jax.tree.map(lambda a: jnp.take(a, ids, axis=0), state.model)  # [K, M, ...]
    rnd = jnp.broadcast_to(out.round, out.clients.shape).astype(jnp.int32)
    parcel = FomoParcel(models=models, position=position, valid=valid & out.valid[:, None], round=rnd)
    shown = jnp.sum(jnp.where(out.valid[:, None], valid, False))
    start = peers.held_rows(out.state, out.parent, out.clients, rank) if holds else None
    return Parcels(start=start, extra=parcel,
                   stats={"fedfomo_candidates": shown / jnp.maximum(jnp.sum(out.valid), 1)})

  def receive(inbox: Inbox, state):   # the servers hold no model of FedFomo's
    if holds:
      assert inbox.slots is not None
      state = peers.held_receive(state, inbox.slots, rank)
    return jax.tree.map(jnp.zeros_like, inbox.pseudo_gradient), state, {}

  def down_bytes(model_bytes: int) -> int:   # M models and their ids down (one model up)
    return m * model_bytes + 4 * m

  def init(params, n):
    return peers.held_start(params, table) if holds else ()

  # (with a client stage its compressors count the bytes up; else one model)
  return ServerRule(init=init, receive=receive, name="fedfomo",
                    down=Downlink(parcels=send_each, bytes=down_bytes),
                    up=Uplink(slots=holds, bytes=None if holds else (lambda b: b)))


def _check_validation_data(name: str, validation_data, data) -> tuple | None:
  """``validation_data`` as device arrays ``(x, y, n)``, checked against the training data (one
  row per client, the examples' shape, ``n`` within the padding); ``None`` if not given."""
  if validation_data is None:
    return None
  if not (isinstance(validation_data, (tuple, list)) and len(validation_data) == 3):
    raise ValueError(f"{name}: validation_data must be (x [C, V, ...], y [C, V], n [C]), every client's "
                     f"validation examples; got a {type(validation_data).__name__}")
  x, y, n = (np.asarray(a) for a in validation_data)
  c = data.num_clients
  if x.shape[:1] != (c,) or y.shape[:2] != x.shape[:2] or n.shape != (c,):
    raise ValueError(f"{name}: validation_data has shapes x {x.shape}, y {y.shape}, n {n.shape}; give one "
                     f"row per client ({c}): x [C, V, ...], y [C, V], n [C]")
  if tuple(x.shape[2:]) != tuple(data.example_shape):
    raise ValueError(f"{name}: validation_data's examples have shape {tuple(x.shape[2:])}, the training "
                     f"data's {tuple(data.example_shape)}")
  if n.min() < 0 or n.max() > x.shape[1]:
    raise ValueError(f"{name}: validation_data's counts n must be in [0, {x.shape[1]}] (its padding); got "
                     f"{int(n.min())}..{int(n.max())}")
  return jnp.asarray(x, data.x_train.dtype), jnp.asarray(y, data.y_train.dtype), jnp.asarray(n, jnp.int32)


@method_over(hierfavg, drops=("server_optimizers",), cannot=peers.uses_each(
  "every client weighs each candidate model on its own (its validation loss per distance)"))
def fedfomo(
  host: Host,
  *,
  num_candidates: int = 5,
  epsilon: float = 0.3,
  epsilon_decay: float = 0.05,
  val_fraction: float = 0.2,
  validation: str = "random",
  pool: str = "last_round",
  validation_data: Any = None,
  name: str = "fedfomo",
) -> FederatedAlgorithm:
  """FedFomo on ``topology`` (default flat): every sampled client receives ``M`` of its peers' models,
  moves towards those that lower its validation loss, then trains (:doc:`the method's page
  <algorithms/peers.md#fedfomo>`).

  Args:
    num_candidates: ``M`` >= 0, the models every sampled client receives (PFLlib's default 5).
    epsilon: ``ε`` in ``[0, 1]``, the first round's probability of exploring (the authors' 0.3).
    epsilon_decay: ``δ`` >= 0, subtracted from ``ε`` every round (the authors' 0.05).
    val_fraction: the fraction of a client's examples held out as its validation split, in
      ``(0, 1)`` (the paper's and PFLlib's 0.2).
    validation: ``"random"`` (a fixed pseudo-random split) or ``"last"`` (the last examples as
      stored, PFLlib's).
    pool: the candidates: ``"last_round"`` (the clients that sent a model the previous round) or
      ``"all"`` (every other client's latest model, PFLlib's).
    validation_data: a separate validation split where the data has one: ``(x [C, V, ...], y [C, V],
      n [C])``, every client's validation examples (padded to ``V``; FLGo's ``val_data``); the clients
      then train on all their training examples, and ``val_fraction`` and ``validation`` are not read.
      ``None``: a split held out of the training examples.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``cohort_size``,
      ``topology``, ``sampling``, ``systems``, ``local_optimizer``, ...).

  Raises:
    ValueError: an option that does not exist, a hyperparameter out of range, ``M`` larger than a
      parent's pool, ``batch_order="cyclic"``, an update path's stage on the parents' sum (central
      DP's noise, SecAgg), a robust aggregator or a downlink transform (the client stage, local DP
      and compression, acts on every client's update against its parent's copy, :doc:`docs
      <algorithms/peers.md#fedfomo>`), personal parameters, server optimizers or a model with
      BatchNorm statistics.

  Example:
    Three rounds of FedFomo over 6 clients, each receiving 2 candidates:

    >>> data, _ = grouped_synthetic(group_sizes=(3, 3), dim=8, num_classes=3)
    >>> alg = fedfomo(model=model, data=data, local_optimizer=optax.sgd(0.1), num_candidates=2,
    ...               schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=3, key=jax.random.key(0))
    >>> state.client_state.affinity.shape   # every client's affinities to the 6 clients
    (6, 6)
  """
  if pool not in POOLS:
    raise ValueError(f"{name}: pool={pool!r}; choose one of {POOLS}")
  if validation not in VALIDATIONS:
    raise ValueError(f"{name}: validation={validation!r}; choose one of {VALIDATIONS}")
  try:
    check_nonnegative(epsilon=epsilon, epsilon_decay=epsilon_decay)
    check_positive(val_fraction=val_fraction)
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from e
  if not is_traced(epsilon) and float(epsilon) > 1:
    raise ValueError(f"{name}: epsilon={epsilon} is a probability, in [0, 1]")
  if not is_traced(val_fraction) and float(val_fraction) >= 1:
    raise ValueError(f"{name}: val_fraction={val_fraction} leaves no example to train on; choose it in "
                     f"(0, 1)")
  if int(num_candidates) != num_candidates or int(num_candidates) < 0:
    raise ValueError(f"{name}: num_candidates={num_candidates} (M) must be an integer >= 0")
  data = host["data"]
  given = _check_validation_data(name, validation_data, data)
  schedule = host.get("schedule")
  if given is None and schedule is not None and schedule.batch_order == "cyclic":
    raise ValueError(f"{name}: batch_order='cyclic' keeps a cursor over all of a client's examples, but "
                     f"FedFomo trains on the examples outside its validation split; use 'shuffled' or "
                     f"'fixed'")
  topology = peers.topology_of(host)
  table, rank = peers.children(topology)
  if pool == "last_round":
    most, what = peers.smallest_cohort(host) - 1, "its parent's cohort (cohort_size) less itself"
  else:
    most, what = int(np.bincount(topology.parent(topology.depth)).min()) - 1, "its parent's other clients"
  if int(num_candidates) > most:
    raise ValueError(f"{name}: num_candidates={num_candidates} (M) exceeds the {most} models a client can "
                     f"receive in the smallest pool ({what}, pool={pool!r}); choose M <= {most}")
  rows = int(data.max_train) if data.ragged else int(data.x_train.shape[1])
  width = table.shape[1]
  rule = fomo_server(num_candidates=int(num_candidates), epsilon=epsilon, epsilon_decay=epsilon_decay,
                     pool=pool, table=table, rank=rank if peers.client_stage(host) else None)

  def objective(s: LocalSetup):
    return fomo_update(s.model, s.optimizer, val_fraction=val_fraction, validation=validation, rows=rows,
                       width=width, batch_size=s.batch_size, max_steps=s.max_steps,
                       compute_dtype=s.compute_dtype, validation_data=given)

  return peers.personal_only(host.build(client_update=objective, server_rule=rule, name=name))
