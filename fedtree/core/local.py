"""Local training of one client, written for ``vmap`` over a cohort.

Every client runs a ``while_loop`` over its own ``num_steps`` (at most ``max_steps``), so
clients with fewer examples, or fewer assigned steps, take fewer steps; vmapped, a chunk of
clients loops to its largest count and clients that are done are left untouched.

Batching happens inside jit. Client ``c`` with ``n`` examples has ``ceil(n / B)`` batches per
epoch; step ``t`` reads batch ``t mod ceil(n/B)`` of epoch ``t // ceil(n/B)``. The last batch
of an epoch may be partial: its missing entries are masked out of the loss (and zeroed, so
even NaN padding cannot leak into a gradient); padding is never read. Epoch-based training
is therefore ``num_steps = epochs · ceil(n / B)``, and a fixed step count is just another
``num_steps``.

The order of the examples is the schedule's ``batch_order`` (:data:`BATCH_ORDERS`):

* ``"shuffled"`` (default): every epoch is a fresh pseudo-random permutation of the ``n``
  real examples (:func:`shuffled_positions`), drawn from the client's key of the round.
* ``"fixed"``: the examples as stored, the same batches every epoch and every round
  (a PyTorch ``DataLoader(shuffle=False)`` rebuilt every round).
* ``"cyclic"``: the examples as stored, read on from a per-client cursor that persists
  across local and global rounds (a ``DataLoader(shuffle=False)`` iterator kept by each
  client and restarted when exhausted, as pFedMe's and PerMFL's code read their data). The
  cursor is a stacked ``int32[C]`` that the algorithm keeps beside the client state and
  :func:`fedtree.core.tier.train_cohort` advances by each trained client's step count.

The order reaches every local objective through :class:`ClientData` (``cursor`` and
``shuffle``), which :func:`batch_at` reads: objectives need no change of their own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.core.checks import check_nonnegative
from fedtree.core.model import Model, forward_train, masked_loss, take_state, zero_state

PyTree = Any


class Batch(NamedTuple):
  """One client's minibatch: ``x: [B, ...]``, ``y: int32[B]`` (``[B, T]`` next tokens of a
  language model), ``mask: bool[B]``."""

  x: jax.Array
  y: jax.Array
  mask: jax.Array


class ClientData(NamedTuple):
  """One client's padded training data and where its batch stream stands.

  Attributes:
    x: ``[M, ...]`` features; rows ``>= n`` are padding.
    y: ``int32[M]`` labels.
    n: ``int32[]`` number of real examples.
    cursor: ``int32[]`` batches already read from the stream (``"cyclic"`` order; else 0):
      step ``t`` reads batch ``cursor + t`` of the stream.
    shuffle: ``bool[]`` each epoch is a keyed permutation (``"shuffled"``) or the stored
      order (``"fixed"``, ``"cyclic"``).
    offset: ``int32[]`` row of ``x`` where the client's examples start in flat storage shared
      by all clients (:mod:`fedtree.core.ragged`); ``None`` for padded rows (start 0).
  """

  x: jax.Array
  y: jax.Array
  n: jax.Array
  cursor: jax.Array | int = 0
  shuffle: jax.Array | bool = True
  offset: jax.Array | None = None


# ------------------------------------------------------------------------ schedule
def steps_per_epoch(n, batch_size: int):
  """``ceil(n / batch_size)`` for numpy or jax integer arrays."""
  return (n + batch_size - 1) // batch_size


BATCH_ORDERS = ("shuffled", "fixed", "cyclic")


def check_batch_order(batch_order: str) -> str:
  """``batch_order`` if it names one of :data:`BATCH_ORDERS`."""
  if batch_order not in BATCH_ORDERS:
    raise ValueError(f"batch_order={batch_order!r}; choose one of {BATCH_ORDERS}")
  return batch_order


def advance_cursor(cursor: jax.Array, num_steps: jax.Array, n: jax.Array, batch_size: int) -> jax.Array:
  """The ``"cyclic"`` cursor after ``num_steps`` more batches, kept in ``[0, ceil(n / B))``."""
  spe = jnp.maximum(steps_per_epoch(n, batch_size), 1)
  return ((cursor + num_steps) % spe).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class LocalSchedule:
  """How long each client trains: ``epochs`` over its own data, or a fixed ``steps`` count.

  With epochs, client ``c`` takes ``ceil(epochs · ceil(n_c / B))`` steps, so clients with
  fewer examples take fewer steps. At most one of ``epochs`` and ``steps`` is given; with
  neither, one epoch. ``steps`` is one count for every client or a tuple with one count per
  client (e.g. FedKWS-UI's adaptive local training). ``batch_order`` is one of
  :data:`BATCH_ORDERS` (see the module docstring): ``"shuffled"`` (default), ``"fixed"`` or
  ``"cyclic"``.
  """

  batch_size: int
  epochs: float | None = None
  steps: int | tuple[int, ...] | None = None
  batch_order: str = "shuffled"

  def __post_init__(self):
    if int(self.batch_size) < 1:
      raise ValueError(f"batch_size={self.batch_size} must be >= 1")
    check_batch_order(self.batch_order)
    if self.epochs is None and self.steps is None:
      object.__setattr__(self, "epochs", 1.0)
    if (self.epochs is None) == (self.steps is None):
      raise ValueError(
        f"give exactly one of local epochs ({self.epochs}) and local steps ({self.steps})"
      )
    if self.epochs is not None and not self.epochs > 0:
      raise ValueError(f"local epochs={self.epochs} must be > 0")
    if isinstance(self.steps, (list, tuple, np.ndarray)):
      object.__setattr__(self, "steps", tuple(int(s) for s in self.steps))
      if not self.steps or min(self.steps) < 0:
        raise ValueError(f"per-client local steps must be non-empty and >= 0, got {self.steps[:10]}")
    elif self.steps is not None and int(self.steps) < 0:
      raise ValueError(f"local steps={self.steps} must be >= 0")

  def num_steps(self, n_train):
    """Per-client step counts (numpy in, numpy out; jax in, jax out)."""
    xp = jnp if isinstance(n_train, jax.Array) else np
    if self.epochs is not None:
      spe = steps_per_epoch(n_train, self.batch_size)
      return xp.ceil(self.epochs * spe).astype(xp.int32)
    if isinstance(self.steps, tuple):
      if len(self.steps) != xp.shape(n_train)[0]:
        raise ValueError(f"{len(self.steps)} per-client local steps for {xp.shape(n_train)[0]} clients")
      return xp.asarray(self.steps, dtype=xp.int32)
    return xp.full(xp.shape(n_train), int(self.steps), dtype=xp.int32)

  @property
  def same_for_all(self) -> bool:
    """Every client takes the same number of steps whatever its data: one fixed ``steps`` count (or
    per-client counts that are all equal)."""
    return self.steps is not None and (not isinstance(self.steps, tuple) or len(set(self.steps)) == 1)

  def init_cursor(self, num_clients: int) -> jax.Array | tuple:
    """The stacked ``int32[C]`` stream cursors of ``"cyclic"`` order (all 0), else ``()``."""
    if self.batch_order == "cyclic":
      return jnp.zeros((num_clients,), jnp.int32)
    return ()

  def max_steps(self, max_examples: int) -> int:
    """Static scan length: the step count of a client with ``max_examples`` examples (the
    largest per-client count when they are explicit)."""
    if isinstance(self.steps, tuple):
      return max(self.steps)
    return int(self.num_steps(np.asarray([max_examples]))[0])


_FEISTEL_ROUNDS = 4


def _mix32(x: jax.Array) -> jax.Array:
  """murmur3's 32-bit finalizer: a fast, well-mixing hash of uint32 values."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def shuffled_positions(key: jax.Array, pos: jax.Array, n: jax.Array) -> jax.Array:
  """``perm[pos]`` for a pseudo-random permutation ``perm`` of ``[0, n)`` chosen by ``key``.

  A keyed 4-round Feistel network is a bijection of ``[0, 4^h)`` with ``4^h >= n``; walking
  its cycle until the value falls inside ``[0, n)`` restricts it to a bijection of
  ``[0, n)`` (Black and Rogaway's cycle walking). Each batch thus costs O(B), whatever the
  client's padded length, instead of sorting ``M`` keys at every step.
  """
  n = jnp.asarray(n).astype(jnp.uint32)
  bits = jnp.uint32(32) - jax.lax.clz(jnp.maximum(n, 1) - 1)       # ceil(log2 n)
  half = (bits + 1) // 2
  low = (jnp.uint32(1) << half) - 1
  round_keys = jax.random.bits(key, (_FEISTEL_ROUNDS,), jnp.uint32)

  def feistel(x):
    left, right = x >> half, x & low
    for i in range(_FEISTEL_ROUNDS):
      left, right = right, left ^ (_mix32(right ^ round_keys[i]) & low)
    return (left << half) | right

  start = feistel(jnp.minimum(pos.astype(jnp.uint32), jnp.maximum(n, 1) - 1))
  out = jax.lax.while_loop(lambda y: jnp.any(y >= n), lambda y: jnp.where(y >= n, feistel(y), y), start)
  return out.astype(jnp.int32)


def batch_at(key: jax.Array, data: ClientData, t: jax.Array, batch_size: int) -> Batch:
  """The minibatch of step ``t``: batch ``data.cursor + t`` of the client's stream, in the
  order ``data.shuffle`` says (see the module docstring)."""
  spe = jnp.maximum(steps_per_epoch(data.n, batch_size), 1)
  t = t + jnp.asarray(data.cursor, jnp.int32)
  epoch, j = t // spe, t % spe
  pos = j * batch_size + jnp.arange(batch_size)
  mask = pos < data.n
  shuffled = shuffled_positions(jax.random.fold_in(key, epoch), pos, data.n)
  idx = jnp.where(data.shuffle, shuffled, jnp.minimum(pos, jnp.maximum(data.n, 1) - 1))
  if data.offset is not None:
    idx = idx + data.offset
  x = data.x[idx]
  x = jnp.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))
  y = data.y[idx]
  y = jnp.where(mask.reshape((-1,) + (1,) * (y.ndim - 1)), y, 0)
  return Batch(x=x, y=y, mask=mask)


# ------------------------------------------------------------------------ the scan
StepFn = Callable[[Any, Batch, jax.Array], tuple[Any, jax.Array]]


def run_local_steps(
  step: StepFn,
  carry: Any,
  data: ClientData,
  num_steps: jax.Array,
  key: jax.Array,
  *,
  batch_size: int,
  max_steps: int,
) -> tuple[Any, jax.Array]:
  """Runs ``step(carry, batch, rng) -> (carry, loss)`` for ``num_steps`` (<= ``max_steps``).

  Returns the final carry and the mean loss over the active steps (0 if none).

  The loop is a ``while_loop`` to ``min(num_steps, max_steps)``. Vmapped over a chunk of
  clients, JAX runs it to the chunk's largest count and leaves every client that is done
  unchanged (a select per step), so clients with different step counts (epochs over
  unequal data, FedKWS-UI's ALT) cost the chunk's maximum, not the population's.
  """
  batch_key, step_key = jax.random.split(key)
  steps = jnp.minimum(num_steps, max_steps)

  def cond(state):
    return state[0] < steps

  def body(state):
    t, carry, loss_sum = state
    batch = batch_at(batch_key, data, t, batch_size)
    carry, loss = step(carry, batch, jax.random.fold_in(step_key, t))
    return t + 1, carry, loss_sum + loss.astype(loss_sum.dtype)

  # The loss sum in the carry's float dtype (float32, or float64 under jax_enable_x64).
  floats = [a for a in jax.tree.leaves(carry) if jnp.issubdtype(jnp.result_type(a), jnp.floating)]
  loss_dtype = jnp.result_type(jnp.float32, *floats)
  init = (jnp.zeros((), jnp.int32), carry, jnp.zeros((), loss_dtype))
  _, carry, loss_sum = jax.lax.while_loop(cond, body, init)
  return carry, loss_sum / jnp.maximum(steps, 1).astype(loss_dtype)


# ------------------------------------------------------------------------ objectives
Regularizer = Callable[[PyTree, PyTree], jax.Array]


@struct.dataclass
class SGDCarry:
  """State of plain local training: ``params``, local optimizer state, and the ``anchor``
  (the model the client downloaded; regularizers such as FedProx's pull towards it)."""

  params: PyTree
  opt_state: PyTree
  anchor: PyTree


def data_loss(model: Model, params: PyTree, batch: Batch, rng: jax.Array) -> jax.Array:
  """Masked loss of ``model`` on ``batch`` (:func:`fedtree.core.model.masked_loss`), in training mode
  (dropout on; a model with state computes its statistics on the batch's real rows,
  :func:`fedtree.core.model.forward_train`)."""
  return train_loss(model, params, batch, rng)[0]


def train_loss(model: Model, params: PyTree, batch: Batch, rng: jax.Array) -> tuple[jax.Array, PyTree]:
  """``(loss, params')``: :func:`data_loss` and ``params`` with the model's non-trainable
  collections updated from the batch's real rows (a model without state: ``params``)."""
  logits, updated = forward_train(model, params, batch.x, rng=rng, mask=batch.mask)
  return masked_loss(model, logits, batch.y, batch.mask), updated


COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def check_compute_dtype(compute_dtype) -> jnp.dtype | None:
  """``None`` (train in the params' own dtype) or a floating dtype named in ``COMPUTE_DTYPES``."""
  if compute_dtype is None:
    return None
  name = jnp.dtype(compute_dtype).name if not isinstance(compute_dtype, str) else compute_dtype
  if name not in COMPUTE_DTYPES:
    raise ValueError(f"compute_dtype={compute_dtype!r}; choose None or one of {COMPUTE_DTYPES}")
  return jnp.dtype(name)


def cast_floating(tree: PyTree, dtype) -> PyTree:
  """Casts every floating leaf of ``tree`` to ``dtype`` (integer leaves are left alone)."""
  if dtype is None:
    return tree
  return jax.tree.map(
    lambda a: a.astype(dtype) if jnp.issubdtype(jnp.result_type(a), jnp.floating) else a, tree
  )


def make_data_loss(model: Model, compute_dtype=None) -> Callable[[PyTree, Batch, jax.Array], jax.Array]:
  """``loss(params, batch, rng)``: :func:`data_loss`, in ``compute_dtype`` when given.

  With ``compute_dtype`` (e.g. ``"bfloat16"``) the forward and backward passes run on params and
  inputs cast to that dtype while the loss (and so every gradient taken through the cast) stays
  in the params' dtype: the mixed precision every objective shares.
  """
  loss = make_train_loss(model, compute_dtype)
  return lambda params, batch, rng: loss(params, batch, rng)[0]


def make_train_loss(model: Model, compute_dtype=None) -> Callable[[PyTree, Batch, jax.Array],
                                                                   tuple[jax.Array, PyTree]]:
  """``loss(params, batch, rng) -> (loss, params')``: :func:`train_loss` (the loss and the model's
  updated statistics), in ``compute_dtype`` when given (see :func:`make_data_loss`; updated
  statistics come back in the params' dtypes)."""
  dtype = check_compute_dtype(compute_dtype)
  if dtype is None:
    return lambda params, batch, rng: train_loss(model, params, batch, rng)

  def loss(params, batch: Batch, rng):
    low = batch._replace(x=cast_floating(batch.x, dtype))
    value, updated = train_loss(model, cast_floating(params, dtype), low, rng)
    updated = jax.tree.map(lambda u, p: u.astype(jnp.result_type(p)), updated, params)
    return value.astype(jnp.float32), updated

  return loss


def after_backward(grads: PyTree) -> PyTree:
  """``grads``, unchanged in value, with every leaf made to depend on every other leaf's gradient.

  An update ``W - lr ∇W`` that reads nothing but ``W`` and ``∇W`` may run before the backward pass's
  other reads of ``W`` (``δ Wᵀ``, the gradient passed to the layer below), as far as XLA's data
  dependencies tell: to update ``W`` in place it then copies ``W`` first, in every local step (one
  more read and write of every weight read by the backward pass; ``benchmarks/param_traffic.py``).
  Scaling every leaf by ``1 + 0 · s``, where ``s`` reads one entry of each gradient leaf (the layer
  below's gradient comes last in the backward pass), orders each update after the whole backward
  pass, so the update runs in place. The scale is exactly 1 (``s`` is zeroed first where it is not
  a small finite number, so no NaN or infinity spreads to another leaf): the result is the same
  bits.
  """
  leaves = [a for a in jax.tree.leaves(grads) if jnp.issubdtype(jnp.result_type(a), jnp.floating) and a.size]
  if len(leaves) < 2:
    return grads
  dtype = jnp.result_type(*leaves)
  s = sum(jnp.ravel(a)[0].astype(dtype) for a in leaves)
  one = 1.0 + 0.0 * jnp.where(jnp.abs(s) < 1.0, s, 0.0)
  return jax.tree.map(lambda a: a * one.astype(a.dtype)
                      if jnp.issubdtype(jnp.result_type(a), jnp.floating) else a, grads)


def make_sgd_step(
  model: Model, optimizer: optax.GradientTransformation, regularizer: Regularizer | None = None,
  *, compute_dtype=None,
) -> StepFn:
  """A step of ``optimizer`` on ``loss(params) + regularizer(params, anchor)``.

  The returned loss is the data loss alone (what users compare across methods). A model with
  state (BatchNorm) takes its statistics from the step's forward pass on the batch's real rows,
  never from a gradient (:func:`fedtree.core.model.zero_state`). With
  ``compute_dtype`` (e.g. ``"bfloat16"``) the forward and backward passes run on params and
  inputs cast to that dtype, while the carried params, the optimizer state, the gradients
  the optimizer sees and the loss stay in the params' dtype (mixed precision; the cast's
  gradient brings the update back to float32).
  """
  loss_fn = make_train_loss(model, compute_dtype)

  def objective(params, anchor, batch, rng):
    loss, updated = loss_fn(params, batch, rng)
    total = loss if regularizer is None else loss + regularizer(params, anchor)
    return total, (loss, updated)

  def step(carry: SGDCarry, batch: Batch, rng: jax.Array):
    grads, (loss, updated) = jax.grad(objective, has_aux=True)(carry.params, carry.anchor, batch, rng)
    grads = after_backward(grads)
    updates, opt_state = optimizer.update(zero_state(model, grads), carry.opt_state, carry.params)
    params = take_state(model, optax.apply_updates(carry.params, updates), updated)
    return dataclasses.replace(carry, params=params, opt_state=opt_state), loss

  return step


def loss_step(loss_fn: Callable[[PyTree, Batch, jax.Array], tuple[jax.Array, jax.Array]],
              optimizer: optax.GradientTransformation) -> StepFn:
  """A step of ``optimizer`` on ``loss_fn(params, batch, rng) -> (objective, reported loss)``, for an
  objective that is not a model's loss plus a regularizer (DepthFL's exits, FjORD's self-distillation;
  :func:`make_sgd_step` for the rest): the step returns the reported loss."""
  def step(carry: SGDCarry, batch: Batch, rng: jax.Array):
    grads, loss = jax.grad(loss_fn, has_aux=True)(carry.params, batch, rng)
    grads = after_backward(grads)
    updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
    params = optax.apply_updates(carry.params, updates)
    return dataclasses.replace(carry, params=params, opt_state=opt_state), loss

  return step


def train_only(optimizer: optax.GradientTransformation, trainable: PyTree) -> optax.GradientTransformation:
  """``optimizer`` on the leaves where ``trainable`` (a pytree of bools shaped as the params) holds;
  every other leaf is frozen: its update is exactly zero whatever the optimizer (weight decay and
  momentum included), and it has no optimizer state. FedRep's head and body phases, FedBABU's
  frozen head, a head-only fine-tune (:func:`make_sgd_step` with it as the optimizer; a BatchNorm
  model's statistics still come from the step's forward pass)."""
  labels = jax.tree.map(lambda t: "train" if t else "frozen", trainable)
  return optax.multi_transform({"train": optimizer, "frozen": optax.set_to_zero()}, labels)


def proximal(mu: float) -> Regularizer:
  """FedProx's ``(μ/2)‖θ - Θ‖²`` towards the anchor."""
  check_nonnegative(mu=mu)

  def reg(params, anchor):
    sq = jax.tree.map(lambda p, a: jnp.sum(jnp.square(p - a)), params, anchor)
    return 0.5 * mu * sum(jax.tree.leaves(sq))

  return reg


def linear() -> Regularizer:
  """The linear term ``⟨v, θ⟩`` with ``v`` the anchor's slot (a constant of the step, e.g.
  SCAFFOLD's correction ``c − c_i`` or FedDyn's ``−∇L_i(θ_i)``): its gradient adds ``v`` to the
  data gradient."""

  def reg(params, v):
    terms = jax.tree.map(lambda p, c: jnp.sum(p * jax.lax.stop_gradient(c).astype(p.dtype)), params, v)
    return sum(jax.tree.leaves(terms))

  return reg


def full_gradient(model: Model, params: PyTree, data: ClientData, *, batch_size: int,
                  compute_dtype=None) -> PyTree:
  """``∇f_i(params)``: the gradient of the client's mean loss over all its ``n`` examples (a pass
  over its data in minibatches of ``batch_size``, in stored order; 0 for a client with none). The
  model's non-trainable collections get no gradient; training mode (dropout on, batch statistics)
  as a local step sees the model."""
  loss_fn = make_data_loss(model, compute_dtype)
  data = data._replace(cursor=0, shuffle=False)
  batches = jnp.maximum(steps_per_epoch(data.n, batch_size), 0)
  key = jax.random.key(0)

  def body(state):
    t, acc = state
    batch = batch_at(key, data, t, batch_size)
    g = jax.grad(loss_fn)(params, batch, jax.random.fold_in(key, t))
    count = jnp.sum(batch.mask)
    return t + 1, jax.tree.map(lambda a, x: a + x * count.astype(x.dtype), acc, g)

  zero = jax.tree.map(jnp.zeros_like, params)
  _, total = jax.lax.while_loop(lambda st: st[0] < batches, body, (jnp.zeros((), jnp.int32), zero))
  n = jnp.maximum(data.n, 1)
  return zero_state(model, jax.tree.map(lambda g: g / n.astype(g.dtype), total))


def full_loss(model: Model, params: PyTree, data: ClientData, *, batch_size: int) -> jax.Array:
  """``f_i(params)``: the client's mean loss over all its ``n`` examples (a pass over its data in
  minibatches of ``batch_size``, in stored order; 0 for a client with none), in inference mode
  (no dropout; a model with state uses its running statistics), as an evaluation would score it:
  the loss q-FFL's and AFL's clients report at the model they receive."""
  data = data._replace(cursor=0, shuffle=False)
  batches = jnp.maximum(steps_per_epoch(data.n, batch_size), 0)
  key = jax.random.key(0)
  dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(params))

  def body(state):
    t, acc = state
    batch = batch_at(key, data, t, batch_size)
    logits = model.apply(params, batch.x, train=False)
    count = jnp.sum(batch.mask).astype(dtype)
    return t + 1, acc + masked_loss(model, logits, batch.y, batch.mask).astype(dtype) * count

  start = (jnp.zeros((), jnp.int32), jnp.zeros((), dtype))
  _, total = jax.lax.while_loop(lambda st: st[0] < batches, body, start)
  return total / jnp.maximum(data.n, 1).astype(dtype)


# ------------------------------------------------------------------------ client updates
class ClientRound(NamedTuple):
  """What a client is told in a round besides its parent's model (one client: vmapped over a
  chunk by :func:`fedtree.core.tier.train_cohort`), for a :class:`ClientUpdate` that
  ``takes_round``.

  Attributes:
    client: ``int32[]`` the client's index.
    parent: ``int32[]`` its parent's index.
    broadcast: what its parent sends beside the model (its row of the server rule's
      :attr:`~fedtree.core.server_rule.Downlink.broadcast`, e.g. SCAFFOLD's control variate ``c``;
      ``()`` when the parent keeps nothing more).
    fraction: ``[]`` the fraction of its parent's clients sampled this round (``|S| / N``).
    weight: ``[]`` its aggregation weight.
    learning_rate: the local learning rate when the host knows it (a float, or a traced scalar in
      a sweep), else ``None``.
    extra: what its parent sends this client alone (the ``extra`` of its parcel,
      :attr:`~fedtree.core.server_rule.Downlink.parcels`: FedFomo's candidate models); ``()`` when
      the parent sends every child the same.
  """

  client: jax.Array
  parent: jax.Array
  broadcast: PyTree
  fraction: jax.Array
  weight: jax.Array
  learning_rate: Any = None
  extra: PyTree = ()


class ClientUpdate(NamedTuple):
  """What one client does in a round, vmapped over a cohort by :mod:`fedtree.core.tier`,
  and the contract it offers the algorithm that runs it.

  ``apply(anchor, state, data, num_steps, key) -> (params, state, loss)``: ``anchor`` is the
  model received from the parent, ``state`` the client's persistent state (any pytree, ``()``
  when stateless), ``params`` the model sent up, ``loss`` the mean local training loss.
  ``init_state(init_params, num_clients) -> state [C, ...]`` builds the stacked persistent
  state of every client (``None``: stateless, the state is ``()``).

  With ``takes_round``, ``apply(anchor, state, data, num_steps, key, round) -> (params, state,
  loss, message)``: ``round`` is a :class:`ClientRound` (the client's index, what its parent
  broadcasts beside the model, the sampled fraction, its weight, the learning rate) and
  ``message`` what the client sends up beside its model (a pytree, ``()`` for nothing), summed
  over each parent's reporting clients and handed to the parent's server rule
  (:mod:`fedtree.core.server_rule`; SCAFFOLD's variate change, FedNova's step count).

  The contract (checked by the algorithms at construction, :func:`check_client_update`):

  * ``starts_from_own_model``: the persistent state *is* the client's own model (a params
    pytree) and training starts from it, the anchor being only what a regularizer pulls
    towards. B-HFL needs exactly this (its clients keep their models across rounds); the
    algorithms whose clients hold nothing but the model they receive refuse it.
  * ``personal_models``: ``state [C, ...] -> params [C, ...]``, the personal models the
    objective adds to the algorithm's ``models()`` (as ``"personal"``; ``None``: none).
  * ``model_state``: it trains a model with state (BatchNorm statistics) correctly, taking the
    statistics from its forward passes (:func:`make_sgd_step`); a host refuses a model with state
    under an update that does not declare it (:func:`check_model_state`).
  * ``message_bytes``: what one client's message costs on the wire when that differs from the
    size of the pytree the engine sums (``None``: its size). E.g. AFL's clients send their loss
    and example count, which the simulation spreads into a one-hot row over the parent's domains
    so that the per-parent sum is a per-domain sum; the byte columns count the two scalars.
  """

  apply: Callable[..., tuple]
  init_state: Callable[[PyTree, int], PyTree] | None = None
  starts_from_own_model: bool = False
  personal_models: Callable[[PyTree], PyTree] | None = None
  takes_round: bool = False
  model_state: bool = False
  message_bytes: int | None = None


def run_update(update: ClientUpdate, anchor, state, data, num_steps, key, round: ClientRound):
  """``(params, state, loss, message)`` of one client: ``update.apply`` with its round when it
  ``takes_round``, else with no message (``()``)."""
  if update.takes_round:
    return update.apply(anchor, state, data, num_steps, key, round)
  params, state, loss = update.apply(anchor, state, data, num_steps, key)
  return params, state, loss, ()


def counting(inner: ClientUpdate, step: Callable) -> ClientUpdate:
  """``inner`` run as ``step(anchor, inner_state, data, num_steps, key, round) -> (params, inner_state,
  loss, message)`` (a method's wrapping of it), its state ``(rounds trained int32[C], inner's state)``:
  the count tells which clients trained, so a round can report what they sent
  (:func:`mean_over_trained`)."""
  def init_state(params, num_clients):
    own = inner.init_state(params, num_clients) if inner.init_state is not None else ()
    return (jnp.zeros((num_clients,), jnp.int32), own)

  def apply(anchor, state, data, num_steps, key, round):
    count, own = state
    params, own, loss, message = step(anchor, own, data, num_steps, key, round)
    return params, (count + 1, own), loss, message

  personal, inner_personal = None, inner.personal_models
  if inner_personal is not None:
    personal = lambda state: inner_personal(state[1])   # noqa: E731
  return inner._replace(apply=apply, init_state=init_state, takes_round=True, personal_models=personal)


def mean_over_trained(before, after, values, window=None) -> jax.Array:
  """The mean of ``values [C]`` over the clients that trained between two client states of a
  :func:`counting` update (0 where none did), in the default float dtype (float64 under x64). Over a
  window of the population (``window``: :attr:`fedtree.core.data.FederatedData.window`, the client of
  each of the states' rows) each row takes its client's value."""
  real = jnp.result_type(float)
  trained = (after[0] - before[0]).astype(real)
  values = jnp.asarray(values, real)
  if window is not None:   # (rows past the window's clients never train)
    values = jnp.take(values, jnp.minimum(jnp.asarray(window), values.shape[0] - 1))
  return jnp.sum(trained * values) / jnp.maximum(jnp.sum(trained), 1.0)


def check_model_state(update: ClientUpdate, model: Model, algorithm: str) -> ClientUpdate:
  """``update`` unless ``model`` has state (BatchNorm statistics) that ``update`` does not
  train (:attr:`ClientUpdate.model_state`), else a ``ValueError`` naming both."""
  if model.state and not update.model_state:
    raise ValueError(
      f"{algorithm}: the model keeps state {list(model.state)} (BatchNorm statistics) that this local "
      f"objective does not update; use plain local training, FedProx or Ditto (their steps update "
      f"the statistics), or a model without BatchNorm (e.g. GroupNorm)")
  return update


def stack(params: PyTree, n: int) -> PyTree:
  """``params`` repeated for ``n`` nodes or clients: every leaf ``[n, ...]``."""
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (n,) + jnp.shape(p)), params)


def check_client_update(
  client_update: ClientUpdate, algorithm: str, *, own_model: bool | None = None, stateless: bool = False,
) -> ClientUpdate:
  """``client_update`` if ``algorithm`` can run it, else a ``ValueError`` that says why.

  Args:
    client_update: the objective.
    algorithm: the algorithm's name (for the message).
    own_model: ``True``: the algorithm's clients keep their own models, so the update must
      start from it (``starts_from_own_model``); ``False``: clients start from the model they
      receive, so it must not; ``None``: either.
    stateless: the algorithm's clients keep no state at all.
  """
  if stateless and client_update.init_state is not None:
    raise ValueError(
      f"{algorithm}: the client update must be stateless: it keeps per-client state (a personal, "
      f"private or own model), but {algorithm}'s clients hold nothing but the model they receive; "
      f"use a stateless objective (plain SGD, FedProx, Per-FedAvg)"
    )
  own = bool(client_update.starts_from_own_model)
  if own_model is True and not own:
    raise ValueError(
      f"{algorithm}: the client update starts from the downloaded model, but {algorithm}'s clients "
      f"train their own persistent models; use an objective built with persistent=True "
      f"(sgd_client_update / fedprox_update); Ditto, pFedMe, Per-FedAvg, ALO and the Moreau step "
      f"start from the downloaded model and cannot run under {algorithm}"
    )
  if own_model is False and own:
    raise ValueError(
      f"{algorithm}: the client update starts from the client's own persistent model "
      f"(persistent=True), but {algorithm}'s clients start from the model they receive; "
      f"build it with persistent=False"
    )
  return client_update


def sgd_client_update(
  model: Model,
  optimizer: optax.GradientTransformation,
  *,
  batch_size: int,
  max_steps: int,
  regularizer: Regularizer | None = None,
  compute_dtype=None,
  persistent: bool = False,
) -> ClientUpdate:
  """Plain local training (FedAvg; FedProx with ``regularizer=proximal(mu)``).

  By default a client starts from the anchor (its parent's model) and keeps no state. With
  ``persistent=True`` its state is its own model (``starts_from_own_model``, also its
  ``personal_models``): it starts from it, the anchor is only what ``regularizer`` pulls
  towards, and the trained model is both sent up and kept (B-HFL's clients).
  ``compute_dtype`` (e.g. ``"bfloat16"``): mixed-precision local steps, see
  :func:`make_sgd_step`.
  """
  step = make_sgd_step(model, optimizer, regularizer, compute_dtype=compute_dtype)

  def apply(anchor, state, data: ClientData, num_steps, key):
    start = state if persistent else anchor
    carry = SGDCarry(params=start, opt_state=optimizer.init(start), anchor=anchor)
    carry, loss = run_local_steps(
      step, carry, data, num_steps, key, batch_size=batch_size, max_steps=max_steps
    )
    return carry.params, (carry.params if persistent else state), loss

  if not persistent:
    return ClientUpdate(apply=apply, model_state=True)
  return ClientUpdate(apply=apply, init_state=stack, starts_from_own_model=True,
                      personal_models=lambda state: state, model_state=True)
