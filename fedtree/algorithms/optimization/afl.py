"""AFL, agnostic federated learning (Mohri, Sivek and Suresh 2019), as FedJAX's ``agnostic_fed_avg``,
on any tree.

The domains (:func:`domain_layout`), the simplex steps (:func:`project_simplex`,
:func:`exponentiated`), the client (:func:`afl_update`), the server rule (:func:`afl_server`) and the
method (:func:`afl`). The equations and how FedJAX and FLGo differ: :doc:`AFL on the optimization page
<algorithms/optimization.md#afl>`.

References:
  Mohri, Sivek and Suresh, Agnostic federated learning, ICML 2019.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.algorithms.optimization.qffl import sent_beside
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, named
from fedtree.core.local import ClientData, ClientRound, ClientUpdate, full_loss, sgd_client_update
from fedtree.core.model import Model
from fedtree.core.server_rule import Downlink, Inbox, ServerRule, Uplink
from fedtree.core.topology import Topology

DOMAIN_STEPS = ("projected", "exponentiated", "none")
INIT_WEIGHTS = ("uniform", "examples")


class Domains(NamedTuple):
  """The static layout of the domains under every parent of clients (numpy; :func:`domain_layout`).

  Attributes:
    parent: ``int32[C]`` every client's parent (a node of the clients' parents' level).
    index: ``int32[C]`` its domain's column in its parent's row of ``λ`` (``[N, D]``).
    present: ``bool[N, D]`` the domains with examples under each parent.
    examples: ``[N, D]`` ``m_d``: the examples of each domain under each parent.
    share: ``[C]`` ``n_k / m_{d(k)}``: a client's share of its domain's examples.
  """

  parent: np.ndarray
  index: np.ndarray
  present: np.ndarray
  examples: np.ndarray
  share: np.ndarray

  @property
  def width(self) -> int:
    return int(self.present.shape[1])

  def initial(self, init_weights: str) -> np.ndarray:
    """``λ₀ [N, D]``: uniform over each parent's present domains, or by their examples."""
    w = (self.present.astype(np.float64) if init_weights == "uniform"
         else np.where(self.present, self.examples, 0.0))
    return w / np.maximum(w.sum(axis=1, keepdims=True), 1e-300)


def domain_layout(topology: Topology, n_train, domains: Sequence[int] | None) -> Domains:
  """The :class:`Domains` of ``topology``'s clients (``n_train`` examples each): ``domains`` one
  integer label per client, or ``None`` (every client its own domain: its rank among its parent's
  children)."""
  parent = np.asarray(topology.parent(topology.depth), np.int64)
  num_nodes = topology.num_nodes(topology.depth - 1)
  n = np.asarray(n_train, np.float64)
  if domains is None:
    index = np.zeros_like(parent)
    for g in range(num_nodes):
      members = np.flatnonzero(parent == g)
      index[members] = np.arange(len(members))
  else:
    index = np.unique(np.asarray(domains), return_inverse=True)[1].reshape(-1)
  examples = np.zeros((num_nodes, int(index.max()) + 1 if index.size else 1))
  np.add.at(examples, (parent, index), n)
  mine = examples[parent, index]
  return Domains(parent=parent.astype(np.int32), index=index.astype(np.int32), present=examples > 0,
                 examples=examples, share=np.where(mine > 0, n / np.where(mine > 0, mine, 1.0), 0.0))


def project_simplex(v: jax.Array, mask: jax.Array) -> jax.Array:
  """The Euclidean projection of every row of ``v`` (``[N, D]``) onto the probability simplex over
  its entries where ``mask`` is true (0 elsewhere): ``max(v − θ, 0)`` with ``θ`` from the sorted
  entries (Duchi et al. 2008)."""
  d = v.shape[-1]
  count = jnp.sum(mask, axis=-1, keepdims=True)
  u = -jnp.sort(jnp.where(mask, -v, jnp.inf), axis=-1)   # present entries first, descending
  j = jnp.arange(1, d + 1, dtype=v.dtype).reshape((1,) * (v.ndim - 1) + (d,))
  valid = j <= count
  css = jnp.cumsum(jnp.where(valid, u, 0.0), axis=-1)
  ok = valid & (u - (css - 1.0) / j > 0)
  rho = jnp.maximum(jnp.sum(ok, axis=-1, keepdims=True), 1)
  theta = (jnp.take_along_axis(css, rho - 1, axis=-1) - 1.0) / rho.astype(v.dtype)
  return jnp.where(mask, jnp.maximum(v - theta, 0.0), 0.0)


def exponentiated(weights: jax.Array, step: jax.Array, mask: jax.Array) -> jax.Array:
  """``λ e^{step} / Σ λ e^{step}`` over every row's entries where ``mask`` is true (in the log
  domain: no overflow)."""
  logits = jnp.where(mask & (weights > 0), jnp.log(jnp.where(weights > 0, weights, 1.0)) + step, -jnp.inf)
  return jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)


def afl_update(
  model: Model, optimizer: optax.GradientTransformation, domains: Domains, *, batch_size: int, max_steps: int,
  compute_dtype=None,
) -> ClientUpdate:
  """AFL's client: FedAvg's local training, and its loss sum and example count at the received
  model as its message (a one-hot row over its parent's domains: see :doc:`docs
  <algorithms/optimization.md#afl>`)."""
  train = sgd_client_update(model, optimizer, batch_size=batch_size, max_steps=max_steps,
                            compute_dtype=compute_dtype)
  column = jnp.asarray(domains.index)
  width = domains.width

  def apply(anchor, state, data: ClientData, num_steps, key, rnd: ClientRound):
    dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(anchor))
    n = data.n.astype(dtype)
    loss_sum = full_loss(model, anchor, data, batch_size=batch_size) * n
    params, state, loss = train.apply(anchor, state, data, num_steps, key)
    one_hot = jax.nn.one_hot(column[rnd.client], width, dtype=dtype)
    return params, state, loss, {"loss": one_hot * loss_sum, "examples": one_hot * n}

  template = jax.eval_shape(model.init, jax.random.key(0))
  itemsize = np.dtype(jnp.result_type(jnp.float32, *jax.tree.leaves(template))).itemsize
  return ClientUpdate(apply=apply, takes_round=True, model_state=True, message_bytes=2 * itemsize)


def afl_server(domains: Domains, *, domain_learning_rate, domain_step: str = "projected",
               init_weights: str = "uniform") -> ServerRule:
  """AFL's server state ``λ [N, D]``: the clients' weights ``λ_{d(k)} n_k / m_{d(k)}`` in their
  parent's mean, and the ascent step on ``λ`` from the domain losses of the clients' messages."""
  present = jnp.asarray(domains.present)
  parent, column, share = (jnp.asarray(a) for a in (domains.parent, domains.index, domains.share))
  start = domains.initial(init_weights)

  def init(params, num_nodes):
    dtype = jnp.result_type(jnp.float32, *jax.tree.leaves(params))
    return jnp.asarray(start, dtype)

  def weights(host_weights, lam):
    return lam[parent, column] * share.astype(lam.dtype)

  def receive(inbox: Inbox, lam):
    count = inbox.messages["examples"]
    seen = count > 0
    loss = jnp.where(seen, inbox.messages["loss"] / jnp.where(seen, count, 1.0), 0.0).astype(lam.dtype)
    rate = jnp.asarray(domain_learning_rate, lam.dtype)
    if domain_step == "projected":
      new = project_simplex(lam + rate * loss, present)
    elif domain_step == "exponentiated":
      new = exponentiated(lam, rate * loss, present)
    else:
      new = lam
    stats = {"afl_weight_max": jnp.max(new, axis=-1),
             "afl_domain_loss_max": jnp.max(jnp.where(seen, loss, -jnp.inf), axis=-1, initial=0.0)}
    return inbox.pseudo_gradient, new, stats

  # nothing is broadcast: the server applies the weights (send: ())
  return ServerRule(init=init, receive=receive, name="afl", down=Downlink(broadcast=lambda lam: ()),
                    up=Uplink(weights=weights))


@method_over(hierfavg, cannot=sent_beside("their losses (which set the weights λ)"))
def afl(
  host: Host,
  *,
  domain_learning_rate: float = 0.1,
  domain_step: str = "projected",
  domains: tuple[int, ...] | None = None,
  init_weights: str = "uniform",
  name: str = "afl",
) -> FederatedAlgorithm:
  """AFL on ``topology`` (default flat): the clients' updates averaged with the weights of the worst
  mixture ``λ`` of their domains, which every round moves by a projected ascent step on the domains'
  losses (:doc:`the method's page <algorithms/optimization.md#afl>`).

  Args:
    domain_learning_rate: ``γ_λ >= 0``, the step on the mixture weights (FedJAX's default 0.1;
      FLGo's 0.01).
    domain_step: ``"projected"`` (the paper's projected gradient ascent), ``"exponentiated"``
      (FedJAX's ``'eg'``) or ``"none"`` (fixed weights).
    domains: one integer domain per client (``None``: every client its own domain). From a
      config: ``domains: clients`` (the default), ``groups`` (the data's group labels) or a list.
    init_weights: ``"uniform"`` or ``"examples"``, the initial ``λ`` over each parent's domains.
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg` (``weighting``
      weighs the levels above the clients' parents only: the clients' weights are ``λ``'s).

  Raises:
    ValueError: ``domain_learning_rate < 0``, an unknown ``domain_step`` or ``init_weights``,
      ``domains`` not one per client, a privacy stage, a robust aggregator or personal parameters.

  Example:
    Two rounds of AFL over 5 clients (each its own domain):

    >>> alg = afl(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...           schedule=LocalSchedule(batch_size=8, steps=2), domain_learning_rate=0.5)
    >>> state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0))
    >>> state.server_state.shape, round(float(state.server_state.sum()), 4)   # λ of the one server
    ((1, 5), 1.0)
  """
  with named(name):
    check_nonnegative(domain_learning_rate=domain_learning_rate)
  if domain_step not in DOMAIN_STEPS:
    raise ValueError(f"{name}: domain_step={domain_step!r}; choose one of {DOMAIN_STEPS}")
  if init_weights not in INIT_WEIGHTS:
    raise ValueError(f"{name}: init_weights={init_weights!r}; choose one of {INIT_WEIGHTS}")
  data = host["data"]
  if domains is not None and len(domains) != data.num_clients:
    raise ValueError(f"{name}: domains has {len(domains)} entries for {data.num_clients} clients; give one "
                     f"integer domain per client (or None: every client its own domain)")
  topology = host.get("topology") or Topology.flat(data.num_clients)
  layout = domain_layout(topology, np.asarray(data.n_train), domains)
  rule = afl_server(layout, domain_learning_rate=domain_learning_rate, domain_step=domain_step,
                    init_weights=init_weights)

  def objective(s: LocalSetup):
    return afl_update(s.model, s.optimizer, layout, batch_size=s.batch_size, max_steps=s.max_steps,
                      compute_dtype=s.compute_dtype)

  return host.build(client_update=objective, server_rule=rule, name=name)
