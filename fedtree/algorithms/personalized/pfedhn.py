"""pFedHN and pFedHN-PC (Shamsian et al. 2021): a hypernetwork at the server makes every client's model
from a learned embedding of the client, on any tree.

The state (``HNState``), the hypernetwork (``init_hypernetwork``, ``generate``, ``hn_optimizer``),
the server rule (``pfedhn_server``) and the method (``pfedhn``). The equations and how the authors'
code and FL-bench differ: :doc:`pFedHN on the peers page <algorithms/peers.md#pfedhn>`.

References:
  Shamsian, Navon, Fetaya and Chechik, Personalized federated learning using hypernetworks,
  ICML 2021.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.personalized.peers import children, topology_of, uses_each
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels
from fedtree.core.checks import check_nonnegative, check_positive
from fedtree.core.model import Model, param_paths
from fedtree.core.personal import Shares, merge, personal, shared_part
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
from fedtree.objectives.fedmmd import last_dense

PyTree = Any


@struct.dataclass
class HNState:
  """What every parent of clients keeps (``[N, ...]`` over the parents).

  Attributes:
    hnet: ``[N, ...]`` the hypernetwork's parameters ``φ`` (:func:`init_hypernetwork`).
    embeddings: ``[N, B, E]`` the embeddings ``v_i`` of its ``B`` children (in their index order,
      :func:`fedtree.algorithms.personalized.peers.children`; rows past a parent's children are unused).
    opt_state: ``[N, ...]`` the hypernetwork optimizer's state over ``(φ, v)``.
  """

  hnet: PyTree
  embeddings: jax.Array
  opt_state: PyTree


def _linear(key, fan_in: int, fan_out: int, dtype):
  """PyTorch's ``nn.Linear`` start: weight and bias uniform in ``±1/√fan_in``."""
  bound = 1.0 / math.sqrt(fan_in)
  kw, kb = jax.random.split(key)
  return {"kernel": jax.random.uniform(kw, (fan_in, fan_out), dtype, -bound, bound),
          "bias": jax.random.uniform(kb, (fan_out,), dtype, -bound, bound)}


def init_hypernetwork(key, target: PyTree, mask: PyTree | None, *, embed_dim: int, hidden: int,
                      n_hidden: int, start: PyTree | None = None) -> PyTree:
  """``φ``: ``{"mlp": [Dense(embed_dim → hidden), n_hidden × Dense(hidden → hidden)], "heads":
  [one Dense(hidden → entries) per generated leaf of ``target``]}`` (the leaves outside ``mask``,
  the personal ones, are not generated). With ``start`` (a model: ``init_params``) every head's
  bias is its leaf and its kernel zero, so that every client's first model is ``start``."""
  leaves = jax.tree.leaves(target)
  generated = [a for a, m in zip(leaves, jax.tree.leaves(mask) if mask is not None else [False] * len(leaves),
                                 strict=True) if not m]
  dtype = jnp.result_type(*leaves) if leaves else jnp.float32
  keys = jax.random.split(key, 1 + n_hidden + len(generated))
  mlp = [_linear(keys[0], embed_dim, hidden, dtype)]
  mlp += [_linear(keys[1 + i], hidden, hidden, dtype) for i in range(n_hidden)]
  heads = [_linear(k, hidden, int(np.prod(np.shape(a))), dtype)
           for k, a in zip(keys[1 + n_hidden:], generated, strict=True)]
  if start is not None:
    flags = jax.tree.leaves(mask) if mask is not None else [False] * len(leaves)
    firsts = [a for a, m in zip(jax.tree.leaves(start), flags, strict=True) if not m]
    heads = [{"kernel": jnp.zeros_like(h["kernel"]), "bias": jnp.asarray(a, dtype).reshape(-1)}
             for h, a in zip(heads, firsts, strict=True)]
  return {"mlp": mlp, "heads": heads}


def generate(hnet: PyTree, v: jax.Array, target: PyTree, mask: PyTree | None) -> PyTree:
  """``h(v; φ)``: a model shaped as ``target`` (zeros at the personal leaves of ``mask``)."""
  z = v @ hnet["mlp"][0]["kernel"] + hnet["mlp"][0]["bias"]
  for layer in hnet["mlp"][1:]:
    z = jax.nn.relu(z) @ layer["kernel"] + layer["bias"]
  leaves, treedef = jax.tree.flatten(target)
  flags = jax.tree.leaves(mask) if mask is not None else [False] * len(leaves)
  heads = iter(hnet["heads"])
  out = []
  for a, m in zip(leaves, flags, strict=True):
    if m:
      out.append(jnp.zeros(np.shape(a), a.dtype))
    else:
      head = next(heads)
      out.append((z @ head["kernel"] + head["bias"]).reshape(np.shape(a)).astype(a.dtype))
  return jax.tree.unflatten(treedef, out)


def hn_optimizer(*, learning_rate, momentum, weight_decay, clip_norm) -> optax.GradientTransformation:
  """The authors' hypernetwork step: ``clip_grad_norm_(·, clip_norm)``, then PyTorch's SGD with
  momentum and (coupled) weight decay."""
  return optax.chain(optax.clip_by_global_norm(clip_norm), optax.add_decayed_weights(weight_decay),
                     optax.sgd(learning_rate, momentum=momentum))


EMBEDDING_STEPS = ("own", "mean")
"""How an embedding's gradient is taken: ``"own"``, its client's ``(∂θ_i/∂v_i)ᵀ Δθ_i`` (the paper's
Algorithm 1), or ``"mean"``, that over the parent's clients that reported, ``1/|S|`` as ``φ``'s
(FLGo's, whose embeddings are a layer of the hypernetwork)."""


def pfedhn_server(template: PyTree, mask: PyTree | None, table: np.ndarray, rank: np.ndarray, *,
                  embed_dim: int, hidden: int, n_hidden: int, optimizer: optax.GradientTransformation,
                  num_parents: int, start: PyTree | None = None, hn_params: PyTree | None = None,
                  embeddings: np.ndarray | None = None, embedding_step: str = "own") -> ServerRule:
  """pFedHN's server (:doc:`docs <algorithms/peers.md#pfedhn>`): every parent's hypernetwork and embeddings,
  every sampled client's generated model as its parcel, the hypernetwork step from the clients' updates.
  ``hn_params`` (every parent's ``φ`` at the start) and ``embeddings`` (``[C, E]`` every client's
  ``v_i`` at the start) replace the random start where given; ``embedding_step``:
  :data:`EMBEDDING_STEPS`."""
  width = table.shape[1]
  rank_of = jnp.asarray(rank)
  # every parent's children's given embeddings, [N, B, E] (rows past a parent's children: zeros)
  given_emb = None if embeddings is None else np.concatenate(
    [np.asarray(embeddings, np.float64), np.zeros((1, embed_dim))])[table]

  def init(params, n, key):
    keys = jax.random.split(key, n)

    def one(k, emb0):
      k_net, k_emb = jax.random.split(k)
      hnet = init_hypernetwork(k_net, template, mask, embed_dim=embed_dim, hidden=hidden, n_hidden=n_hidden,
                               start=start)
      dtype = jax.tree.leaves(hnet)[0].dtype
      if hn_params is not None:
        hnet = jax.tree.map(lambda a: jnp.asarray(a, dtype), hn_params)
      emb = jax.random.normal(k_emb, (width, embed_dim), dtype) if emb0 is None else emb0.astype(dtype)
      return HNState(hnet=hnet, embeddings=emb, opt_state=optimizer.init((hnet, emb)))

    if given_emb is None:
      return jax.vmap(lambda k: one(k, None))(keys)
    return jax.vmap(one)(keys, jnp.asarray(given_emb))

  def make(hnet, embeddings):   # one parent's models for a [B, E] block of embeddings
    return jax.vmap(lambda v: generate(hnet, v, template, mask))(embeddings)

  def blocks_of_embeddings(state: HNState, where) -> jax.Array:   # [N, B, E] of the cohort's slots
    emb = state.embeddings[jnp.clip(where.parent, 0, num_parents - 1), jnp.take(rank_of, where.clients)]
    return cohort_blocks(emb, where, num_parents, where.block_size)

  def send_each(out: Outbox) -> Parcels:
    theta = jax.vmap(make)(out.state.hnet, blocks_of_embeddings(out.state, out))   # [N, B, ...]
    return Parcels(start=slot_rows(theta, out))

  def receive(inbox: Inbox, state: HNState):
    slots = inbox.slots
    assert slots is not None
    ok = slots.reported
    delta = jax.tree.map(lambda s, t: jnp.where(ok.reshape((-1,) + (1,) * (s.ndim - 1)), s - t, 0.0),
                         slots.start, slots.sent)
    if mask is not None:   # no update of the personal leaves reaches the hypernetwork
      delta = jax.tree.map(lambda d, m: jnp.zeros_like(d) if m else d, delta, mask)
    emb = blocks_of_embeddings(state, slots)
    _, pullback = jax.vjp(lambda h, e: jax.vmap(make)(h, e), state.hnet, emb)
    g_hnet, g_emb = pullback(cohort_blocks(delta, slots, num_parents, slots.block_size))
    count = jnp.maximum(jax.ops.segment_sum(ok.astype(jnp.result_type(float)), slots.parent,
                                            num_segments=num_parents), 1.0)
    g_hnet = jax.tree.map(lambda g: g / count.reshape((-1,) + (1,) * (g.ndim - 1)).astype(g.dtype), g_hnet)
    g_rows = jnp.zeros_like(state.embeddings).at[
      slots.parent, jnp.take(rank_of, slots.clients)].add(slot_rows(g_emb, slots) * ok[:, None], mode="drop")
    if embedding_step == "mean":
      g_rows = g_rows / count.reshape((-1, 1, 1)).astype(g_rows.dtype)

    def step(hnet, emb, opt, gh, ge):
      updates, opt = optimizer.update((gh, ge), opt, (hnet, emb))
      hnet, emb = optax.apply_updates((hnet, emb), updates)
      return hnet, emb, opt

    hnet, emb, opt = jax.vmap(step)(state.hnet, state.embeddings, state.opt_state, g_hnet, g_rows)
    zero = jax.tree.map(jnp.zeros_like, inbox.pseudo_gradient)   # the parents' own models stay
    return zero, HNState(hnet=hnet, embeddings=emb, opt_state=opt), {}

  return ServerRule(init=init, receive=receive, name="pfedhn",  # type: ignore[arg-type]
                    down=Downlink(broadcast=lambda state: (), parcels=send_each),   # (each its parcel)
                    up=Uplink(slots=True), init_key=True)


def head_pattern(model: Model, template: PyTree, example_shape) -> str:
  """A path pattern naming the model's classifier head: the ``nn.Dense`` whose output is the logits."""
  x = jax.ShapeDtypeStruct((2,) + tuple(example_shape), jnp.dtype(model.input_dtype))
  found = {}

  def probe(p, v):
    layer, _, _ = last_dense(model, p, v)
    found["name"] = None if layer is None else layer.name
    return 0

  jax.eval_shape(probe, template, x)
  name = found.get("name")
  if name is None:
    raise ValueError("pFedHN-PC keeps each client's classifier head, but this model's logits are not the "
                     "output of an nn.Dense layer; name the head with personal= (path patterns)")
  pattern = f"(^|/){re.escape(name)}/"
  if not any(re.search(pattern, p) for p in param_paths(template)):
    raise ValueError(f"pFedHN-PC: the head {name!r} is not a top-level layer of the model's parameters "
                     f"{param_paths(template)}; name it with personal=")
  return pattern


def _check_start(name: str, hn_params, embeddings, template, mask, *, embed: int, hidden: int, n_hidden: int,
                 num_clients: int) -> None:
  """``hn_params`` shaped as the hypernetwork :func:`init_hypernetwork` makes, ``embeddings`` as
  ``[C, E]``; a ``ValueError`` naming the first leaf that is not."""
  if hn_params is not None:
    want = jax.eval_shape(lambda k: init_hypernetwork(k, template, mask, embed_dim=embed, hidden=hidden,
                                                      n_hidden=n_hidden), jax.random.key(0))
    if jax.tree.structure(hn_params) != jax.tree.structure(want):
      raise ValueError(f"{name}: hn_params is laid out as {jax.tree.structure(hn_params)}; the "
                       f"hypernetwork (embed_dim={embed}, hidden={hidden}, n_hidden={n_hidden}) is "
                       f"{jax.tree.structure(want)}")
    for (path, a), w in zip(jax.tree_util.tree_flatten_with_path(hn_params)[0], jax.tree.leaves(want),
                            strict=True):
      if tuple(np.shape(a)) != tuple(w.shape):
        raise ValueError(f"{name}: hn_params{jax.tree_util.keystr(path)} has shape {tuple(np.shape(a))}; "
                         f"the hypernetwork's is {tuple(w.shape)}")
  if embeddings is not None and tuple(np.shape(embeddings)) != (num_clients, embed):
    raise ValueError(f"{name}: embeddings has shape {tuple(np.shape(embeddings))}; give one row of "
                     f"embed_dim={embed} per client: ({num_clients}, {embed})")


@method_over(hierfavg, drops=("server_optimizers",), cannot=uses_each(
  "the hypernetwork takes each client's update Δθ_i through that client's own Jacobian", personal=False))
def pfedhn(
  host: Host,
  *,
  embed_dim: int = -1,
  hidden: int = 100,
  n_hidden: int = 3,
  hn_learning_rate: float = 1e-2,
  hn_momentum: float = 0.9,
  hn_weight_decay: float = 1e-3,
  clip_norm: float = 50.0,
  personal_head: bool = False,
  hn_params: PyTree | None = None,
  embeddings: Any = None,
  embedding_step: str = "own",
  name: str = "pfedhn",
) -> FederatedAlgorithm:
  """pFedHN (or pFedHN-PC with ``personal_head``) on ``topology`` (default flat): every parent's
  hypernetwork makes each sampled client's model ``θ_i = h(v_i; φ)`` and learns from its update
  (:doc:`the method's page <algorithms/peers.md#pfedhn>`).

  Args:
    embed_dim: the embeddings' width (-1: the authors' ``⌊1 + B/4⌋`` for a parent's ``B`` clients).
    hidden: the hypernetwork's hidden width (the authors' 100).
    n_hidden: its hidden layers after the first (the authors' 3).
    hn_learning_rate: the hypernetwork's SGD rate (the authors' 10⁻²).
    hn_momentum: its momentum (0.9).
    hn_weight_decay: its weight decay (10⁻³).
    clip_norm: the global norm its gradient is clipped to (50).
    personal_head: pFedHN-PC: each client keeps its own classifier head (the model's last dense
      layer; ``personal=`` names other layers).
    hn_params: the hypernetwork ``φ`` every parent starts from (a reference's, converted: ``{"mlp":
      [{"kernel": [in, out], "bias": [out]}, ...], "heads": [...]}``, as :func:`init_hypernetwork`
      lays it out); ``None``: PyTorch's ``nn.Linear`` start.
    embeddings: ``[C, E]`` every client's embedding ``v_i`` at the start; ``None``: standard normal.
    embedding_step: ``"own"`` (the paper: each embedding steps on its client's gradient) or
      ``"mean"`` (FLGo: divided by the clients that reported, as ``φ``'s), :data:`EMBEDDING_STEPS`.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``cohort_size``,
      ``topology``, ``sampling``, ``systems``, ``local_optimizer``, ...).

  Raises:
    ValueError: a size or rate out of range, ``hn_params`` or ``embeddings`` not shaped as the
      hypernetwork's, an unknown ``embedding_step``, an update path's stage on the parents' sum
      (central DP's noise, SecAgg), a robust aggregator or a downlink transform (the client stage,
      local DP and compression, acts on every ``Δθ_i``), server optimizers, personal parameters
      shared within a subtree, or a model with BatchNorm statistics.

  Example:
    Two rounds of pFedHN over 5 clients, 2 sampled a round:

    >>> alg = pfedhn(model=model, data=data, local_optimizer=optax.sgd(0.1), cohort_size=2, hidden=16,
    ...              schedule=LocalSchedule(batch_size=8, steps=2))
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> state.server_state.embeddings.shape   # one server, its 5 clients' embeddings
    (1, 5, 2)
  """
  for field, v in (("hidden", hidden), ("n_hidden", n_hidden)):
    if int(v) != v or int(v) < (1 if field == "hidden" else 0):
      raise ValueError(f"{name}: {field}={v} must be an integer >= {1 if field == 'hidden' else 0}")
  if int(embed_dim) != embed_dim or (int(embed_dim) < 1 and int(embed_dim) != -1):
    raise ValueError(f"{name}: embed_dim={embed_dim} must be an integer >= 1, or -1 (the authors' 1 + B/4)")
  try:
    check_positive(hn_learning_rate=hn_learning_rate, clip_norm=clip_norm)
    check_nonnegative(hn_momentum=hn_momentum, hn_weight_decay=hn_weight_decay)
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from e
  if embedding_step not in EMBEDDING_STEPS:
    raise ValueError(f"{name}: embedding_step={embedding_step!r}; choose one of {EMBEDDING_STEPS}")
  spec = host.get("personal")
  if spec is not None and spec.level is not None:
    raise ValueError(f"{name}: personal parameters shared within level-{spec.level} subtrees are not "
                     f"supported (a parent's hypernetwork makes each client's model); use level=None")
  model, data = host["model"], host["data"]
  template = host.get("init_params")
  template = jax.eval_shape(model.init, jax.random.key(0)) if template is None else template
  if personal_head and spec is None:
    spec = personal(head_pattern(model, template, data.example_shape))
  topology = topology_of(host)
  depth = topology.depth
  share = Shares.of(spec, template, depth, name)
  mask = share.client_mask
  table, rank = children(topology)
  width = table.shape[1]
  embed = int(1 + width / 4) if int(embed_dim) == -1 else int(embed_dim)
  num_parents = topology.num_nodes(depth - 1)
  optimizer = hn_optimizer(learning_rate=hn_learning_rate, momentum=hn_momentum, weight_decay=hn_weight_decay,
                           clip_norm=clip_norm)
  _check_start(name, hn_params, embeddings, template, mask, embed=embed, hidden=int(hidden),
               n_hidden=int(n_hidden), num_clients=topology.num_clients)
  rule = pfedhn_server(template, mask, table, rank, embed_dim=embed, hidden=int(hidden),
                       n_hidden=int(n_hidden), optimizer=optimizer, num_parents=num_parents,
                       start=host.get("init_params"), hn_params=hn_params, embeddings=embeddings,
                       embedding_step=embedding_step)
  alg = host.replace(personal=spec).build(server_rule=rule, name=name)
  parent = jnp.asarray(topology.parent(depth))
  rank_of = jnp.asarray(rank)

  def models(state):
    rules: HNState = state.server_state
    every = jax.vmap(lambda h, e: jax.vmap(lambda v: generate(h, v, template, mask))(e))(rules.hnet,
                                                                                       rules.embeddings)
    own = jax.tree.map(lambda a: a[parent, rank_of], every)   # [C, ...] each client's generated model
    if mask is not None:   # its own head where it keeps one
      own = merge(shared_part(own, mask), share.unpack(state.personal), mask)
    return {"personal": NodeModels(own, np.arange(topology.num_clients, dtype=np.int32))}

  return alg._replace(models=models)
