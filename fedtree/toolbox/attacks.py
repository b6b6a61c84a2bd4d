"""Byzantine clients: which clients are malicious, and what they send instead of their update.

* :func:`attackers` marks the malicious clients (:class:`Attackers`): explicit ids, or a
  fraction of all clients drawn from a seed (the same set every round; the fraction may be a
  traced value, so a sweep axis), or redrawn every round (each client malicious with
  probability ``fraction``, from the round's key).
* Model poisoning on one update, as :class:`~fedtree.core.updates.ClientTransform` s (vmapped;
  a benign client's update passes unchanged, bitwise): :func:`sign_flip`, :func:`scaling`
  (model replacement, Bagdasaryan et al. 2020: a boost ``n / η`` makes the parent's mean the
  attacker's model), :func:`gaussian` (a random update).
* Omniscient attacks that know the benign updates of the same parent (:class:`OmniscientAttack`
  s, one factory each: :func:`alie`, :func:`ipm`, :func:`min_max`, :func:`min_sum`), run as a
  wrapper of a blockwise aggregator (:func:`omniscient`): the attackers' rows of every parent's
  :class:`~fedtree.core.updates.Block` are rewritten from the benign rows' coordinate mean ``μ``
  and standard deviation ``σ``, then the wrapped aggregator runs (:func:`fedtree.toolbox.robust.mean`
  for no defence). ALIE (Baruch et al. 2019): ``μ - z σ``; IPM (Xie et al. 2020): ``-ε μ``;
  min-max / min-sum (Shejwalkar & Houmansadr 2021): ``μ + γ p`` with ``γ`` the largest (by
  halving search) that keeps the malicious update's largest (min-max) / summed squared (min-sum)
  distance to the benign ones within the benign ones' own largest.

Every attack reports ``attackers``: per client, 1 for an attacker (the round metric is the
fraction of the reporting clients that attacked); the omniscient wrapper reports it per parent
(the mean number of attackers per parent).

Example:
  >>> import jax, jax.numpy as jnp
  >>> from fedtree.core.updates import ClientContext
  >>> t = sign_flip(attackers(4, ids=(1,)))
  >>> ctx = ClientContext(jnp.arange(4), jnp.zeros(4, jnp.int32), jnp.ones(4), {})
  >>> keys = jax.random.split(jax.random.key(0), 4)
  >>> d, _, st = jax.vmap(t.apply)(jnp.ones((4, 2)), jnp.zeros(4), keys, ctx)
  >>> d[:, 0].tolist(), st["attackers"].tolist()
  ([1.0, -1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri

from fedtree.core.updates import Aggregator, Block, ClientTransform
from fedtree.toolbox import robust
from fedtree.toolbox.robust import _bcast, _dist_to, pairwise_sq_distances

PyTree = Any

PERTURBATIONS = ("std", "unit", "sign")
"""The directions ``p`` of :func:`min_max` / :func:`min_sum`: ``-σ``, ``-μ / ‖μ‖``, ``-sign(μ)``."""


class Attackers(NamedTuple):
  """Which clients are malicious (see :func:`attackers`).

  Attributes:
    order: ``int32[C]`` every client's rank in the seeded draw (``fraction`` mode), or ``()``.
    fixed: ``bool[C]`` the explicit attackers (``ids`` mode), or ``()``.
    fraction: the fraction of clients that attack (may be traced).
    redraw: draw the attackers anew each round from the round's key.
  """

  order: Any = ()
  fixed: Any = ()
  fraction: Any = 0.0
  redraw: bool = False

  def mask(self, client: jax.Array, key: jax.Array | None) -> jax.Array:
    """``bool`` of the shape of ``client`` (ids; negative or out of range: not malicious). In
    ``redraw`` mode client ``c`` attacks with probability ``fraction`` by its own stream
    ``fold_in(key, c)`` of ``key`` (the round's)."""
    client = jnp.asarray(client, jnp.int32)
    if self.redraw:
      assert key is not None
      keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(client.reshape(-1))
      draw = jax.vmap(lambda k: jax.random.uniform(k))(keys).reshape(client.shape)
      return (draw < self.fraction) & (client >= 0)
    table = self.fixed if not isinstance(self.fixed, tuple) else self.order < jnp.round(
      jnp.asarray(self.fraction, jnp.result_type(float)) * self.order.shape[0]).astype(jnp.int32)
    n = table.shape[0]
    return jnp.take(table, jnp.clip(client, 0, n - 1)) & (client >= 0) & (client < n)


def attackers(num_clients: int, *, fraction: float | None = None, ids: Sequence[int] | None = None,
              seed: int = 0, redraw: bool = False) -> Attackers:
  """The malicious clients among ``num_clients``.

  Args:
    num_clients: the number of clients (of the level attacked: the nodes below a server level).
    fraction: ``round(fraction * num_clients)`` clients drawn by ``seed`` (the same ones every
      round; a larger fraction keeps the smaller one's attackers), or with ``redraw`` each client
      attacks with probability ``fraction`` every round. May be traced (a sweep axis).
    ids: the attackers explicitly (instead of ``fraction``).
    seed: the draw's seed.
    redraw: draw anew every round.

  Raises:
    ValueError: both or neither of ``fraction`` and ``ids``; a fraction outside ``[0, 1]``; an id
      outside ``[0, num_clients)``; ``redraw`` with ``ids``.
  """
  if (fraction is None) == (ids is None):
    raise ValueError(f"attackers: give one of fraction= and ids= (got fraction={fraction!r}, ids={ids!r})")
  if ids is not None:
    idx = np.asarray(list(ids), np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= num_clients):
      raise ValueError(f"attackers: ids={list(ids)!r} must lie in [0, {num_clients})")
    if redraw:
      raise ValueError("attackers: redraw=True draws a fraction each round; it cannot take ids=")
    fixed = np.zeros(num_clients, bool)
    fixed[idx] = True
    return Attackers(fixed=jnp.asarray(fixed), fraction=float(fixed.mean()))
  assert fraction is not None
  if not isinstance(fraction, jax.core.Tracer) and not 0.0 <= float(fraction) <= 1.0:
    raise ValueError(f"attackers: fraction={fraction!r} must be in [0, 1]")
  if redraw:
    return Attackers(fraction=fraction, redraw=True)
  u = jax.random.uniform(jax.random.key(seed), (num_clients,))
  order = jnp.argsort(jnp.argsort(u)).astype(jnp.int32)
  return Attackers(order=order, fraction=fraction)


# ------------------------------------------------------------------------ one update at a time
def _replace_if(attacker: Attackers, name: str,
                make: Callable[[PyTree, jax.Array], PyTree]) -> ClientTransform:
  def apply(delta, state, key, ctx):
    bad = attacker.mask(ctx.client, jax.random.fold_in(key, 0))
    new = make(delta, jax.random.fold_in(key, 1))
    out = jax.tree.map(lambda n, d: jnp.where(bad, n.astype(d.dtype), d), new, delta)
    return out, state, {"attackers": bad.astype(jnp.result_type(float))}

  return ClientTransform(apply, name=name)


def _check_nonzero(name: str, field: str, value, *, positive: bool, meaning: str) -> None:
  if isinstance(value, jax.core.Tracer):
    return
  v = float(value)
  if not math.isfinite(v) or (v <= 0 if positive else v == 0):
    need = "a finite number > 0" if positive else "a finite number other than 0"
    raise ValueError(f"{name}: {field}={value!r} must be {need} ({meaning})")


def sign_flip(attacker: Attackers, *, scale: float = 1.0) -> ClientTransform:
  """Attackers send ``-scale * delta``.

  Raises:
    ValueError: ``scale`` not > 0 (0 sends nothing: a dropout, not an attack).
  """
  _check_nonzero("sign_flip", "scale", scale, positive=True,
                 meaning="attackers send -scale x their update; scale=0 sends zeros, no attack")
  return _replace_if(attacker, "sign_flip", lambda d, k: jax.tree.map(lambda x: -scale * x, d))


def scaling(attacker: Attackers, *, factor: float) -> ClientTransform:
  """Attackers send ``factor * delta`` (model replacement with ``factor = n / η``: ``n`` clients
  per parent, ``η`` the server learning rate).

  Raises:
    ValueError: ``factor`` 0 (zeros: a dropout, not an attack).
  """
  _check_nonzero("scaling", "factor", factor, positive=False,
                 meaning="attackers send factor x their update; factor=0 sends zeros, no attack")
  return _replace_if(attacker, "scaling", lambda d, k: jax.tree.map(lambda x: factor * x, d))


def gaussian(attacker: Attackers, *, std: float = 1.0) -> ClientTransform:
  """Attackers send Gaussian noise ``N(0, std²)`` in every coordinate instead of their update.

  Raises:
    ValueError: ``std`` not > 0.
  """
  _check_nonzero("gaussian", "std", std, positive=True, meaning="the noise's standard deviation")

  def noise(d, key):
    leaves, treedef = jax.tree.flatten(d)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([std * jax.random.normal(k, x.shape, x.dtype)
                              for k, x in zip(keys, leaves, strict=True)])

  return _replace_if(attacker, "gaussian", noise)


# ------------------------------------------------------------------------ omniscient
class OmniscientAttack(NamedTuple):
  """What every parent's attackers send, knowing the benign updates of their parent's cohort
  (built by :func:`alie`, :func:`ipm`, :func:`min_max`, :func:`min_sum`; run by :func:`omniscient`).

  Attributes:
    malicious: ``malicious(block, bad) -> [P, ...]`` one update per parent, from its benign
      updates (``block.valid & ~bad``).
    name: names the attack in the wrapped aggregator's name and in errors.
    pairwise: it keeps every parent's ``K x K`` distances between updates (its memory estimate).
  """

  malicious: Callable[[Block, jax.Array], PyTree]
  name: str
  pairwise: bool = False


def _moments(block: Block, benign: jax.Array) -> tuple[PyTree, PyTree]:
  nb = jnp.maximum(jnp.sum(benign, axis=1), 1)

  def mean(d):
    return jnp.sum(jnp.where(_bcast(benign, d), d, 0), axis=1) / _bcast(nb, d[:, 0]).astype(d.dtype)

  mu = jax.tree.map(mean, block.deltas)
  var = jax.tree.map(lambda d, m: jnp.sum(jnp.where(_bcast(benign, d), jnp.square(d - m[:, None]), 0), axis=1)
                     / _bcast(nb, m).astype(d.dtype), block.deltas, mu)
  return mu, jax.tree.map(jnp.sqrt, var)


def _norm(tree) -> jax.Array:
  """``[P]`` norms of a ``[P, ...]`` tree."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.reshape(x.shape[0], -1)), axis=1) for x in jax.tree.leaves(tree)))


def alie(*, z: float | None = None) -> OmniscientAttack:
  """ALIE (Baruch et al. 2019): the attackers send ``μ - z σ``, the benign updates' coordinate
  mean and standard deviation. ``z``: ``None`` is Baruch et al.'s ``Φ⁻¹((n - s) / n)``,
  ``s = ⌊n/2 + 1⌋ - m`` for ``n`` updates of which ``m`` malicious (per parent, every round)."""

  def malicious(block: Block, bad: jax.Array) -> PyTree:
    mu, sigma = _moments(block, block.valid & ~bad)
    if z is None:
      n = jnp.sum(block.valid, axis=1).astype(jnp.result_type(float))
      m = jnp.sum(bad & block.valid, axis=1).astype(jnp.result_type(float))
      s = jnp.floor(n / 2 + 1) - m
      zz = ndtri(jnp.clip((n - s) / jnp.maximum(n, 1), 1e-6, 1 - 1e-6))
    else:
      zz = jnp.broadcast_to(jnp.asarray(z, jnp.result_type(float)), bad.shape[:1])
    return jax.tree.map(lambda m_, s_: m_ - _bcast(zz, m_).astype(m_.dtype) * s_, mu, sigma)

  return OmniscientAttack(malicious, "alie")


def ipm(*, eps: float = 0.1) -> OmniscientAttack:
  """IPM (Xie et al. 2020): the attackers send ``-ε μ``, the benign updates' mean turned back."""

  def malicious(block: Block, bad: jax.Array) -> PyTree:
    mu, _ = _moments(block, block.valid & ~bad)
    return jax.tree.map(lambda m_: -eps * m_, mu)

  return OmniscientAttack(malicious, "ipm")


def _largest_shift(name: str, reduce, gamma_init, iterations, perturbation) -> OmniscientAttack:
  """Min-max (``reduce`` the max) or min-sum (the sum) of Shejwalkar & Houmansadr 2021: ``μ + γ p``
  with ``γ`` the largest (by halving search from ``gamma_init``) that keeps the malicious update's
  ``reduce`` of squared distances to the benign ones within the largest such of a benign one."""
  if perturbation not in PERTURBATIONS:
    raise ValueError(f"{name}: perturbation={perturbation!r}; choose one of {list(PERTURBATIONS)}")

  def malicious(block: Block, bad: jax.Array) -> PyTree:
    benign = block.valid & ~bad
    mu, sigma = _moments(block, benign)
    if perturbation == "std":
      p = jax.tree.map(jnp.negative, sigma)
    elif perturbation == "unit":
      nm = jnp.maximum(_norm(mu), 1e-30)
      p = jax.tree.map(lambda m_: -m_ / _bcast(nm, m_).astype(m_.dtype), mu)
    else:
      p = jax.tree.map(lambda m_: -jnp.sign(m_), mu)
    dist = pairwise_sq_distances(block.deltas)
    pair = benign[:, :, None] & benign[:, None, :]
    bound = jnp.max(reduce(jnp.where(pair, dist, 0.0), axis=2), axis=1)

    def feasible(gamma):
      x = jax.tree.map(lambda m_, p_: m_ + _bcast(gamma, m_).astype(m_.dtype) * p_, mu, p)
      d2 = jnp.where(benign, jnp.square(_dist_to(block, x)), 0.0)
      return reduce(d2, axis=1) <= bound

    def step(_, carry):
      gamma, stride, best = carry
      ok = feasible(gamma)
      best = jnp.where(ok, gamma, best)
      return gamma + jnp.where(ok, stride, -stride), stride / 2, best

    g0 = jnp.full(bad.shape[:1], gamma_init, jnp.result_type(float))
    _, _, best = jax.lax.fori_loop(0, int(iterations), step, (g0, g0 / 2, jnp.zeros_like(g0)))
    return jax.tree.map(lambda m_, p_: m_ + _bcast(best, m_).astype(m_.dtype) * p_, mu, p)

  return OmniscientAttack(malicious, name, pairwise=True)


def min_max(*, gamma_init: float = 10.0, iterations: int = 20, perturbation: str = "std") -> OmniscientAttack:
  """Min-max (Shejwalkar & Houmansadr 2021): ``μ + γ p`` with ``γ`` the largest (halving search from
  ``gamma_init``, ``iterations`` steps) that keeps the malicious update's largest distance to a benign
  one within the benign ones' own largest; ``p`` is ``-σ`` (``perturbation="std"``), ``-μ / ‖μ‖``
  (``"unit"``) or ``-sign(μ)`` (``"sign"``).

  Raises:
    ValueError: an unknown ``perturbation`` (the allowed ones listed).
  """
  return _largest_shift("min_max", jnp.max, gamma_init, iterations, perturbation)


def min_sum(*, gamma_init: float = 10.0, iterations: int = 20, perturbation: str = "std") -> OmniscientAttack:
  """Min-sum (Shejwalkar & Houmansadr 2021): as :func:`min_max` with the summed squared distances
  to the benign updates in place of the largest.

  Raises:
    ValueError: an unknown ``perturbation`` (the allowed ones listed).
  """
  return _largest_shift("min_sum", jnp.sum, gamma_init, iterations, perturbation)


def poison_block(block: Block, attacker: Attackers, key: jax.Array,
                 attack: OmniscientAttack) -> tuple[Block, jax.Array]:
  """``block`` with every attacker's row replaced by its parent's malicious update (``attack``'s;
  rows of a parent with no benign update are left as they are), and the ``bool [P, K]`` attackers."""
  bad = attacker.mask(block.clients, key) & block.valid
  x = attack.malicious(block, bad)
  has_benign = jnp.any(block.valid & ~bad, axis=1)
  rewrite = bad & has_benign[:, None]
  deltas = jax.tree.map(lambda d, v: jnp.where(_bcast(rewrite, d), v[:, None].astype(d.dtype), d),
                        block.deltas, x)
  return block._replace(deltas=deltas), bad


def omniscient(aggregator: Aggregator, attacker: Attackers, attack: OmniscientAttack) -> Aggregator:
  """``aggregator`` run on every parent's cohort after its attackers' rows are rewritten by
  ``attack`` (:func:`alie`, :func:`ipm`, :func:`min_max`, :func:`min_sum`). A streamed
  (non-blockwise) ``aggregator`` is replaced by the blockwise weighted mean. Stat ``attackers``:
  per parent, how many of its updates were malicious."""
  inner = aggregator if aggregator.blockwise else robust.mean()

  def aggregate(block, node_state, key):
    poisoned, bad = poison_block(block, attacker, jax.random.fold_in(key, 0), attack)
    assert inner.aggregate is not None
    watch = {"watch": bad} if robust.watches(inner) else {}
    s, w, stats = inner.aggregate(poisoned, node_state, jax.random.fold_in(key, 1), **watch)
    return s, w, {**stats, "attackers": jnp.sum(bad, axis=1).astype(jnp.result_type(float))}

  return Aggregator(aggregate, name=f"{attack.name}+{aggregator.name}",
                    pairwise=attack.pairwise or inner.pairwise,
                    for_attack=None if aggregator.blockwise else attack.name)


def watch_kept(aggregator: Aggregator, attacker: Attackers) -> Aggregator:
  """``aggregator`` reporting ``kept_attackers`` (per parent, how many of the updates it kept were
  ``attacker`` 's; :func:`fedtree.toolbox.robust.watches`) when it chooses among the updates (Krum,
  multi-Krum, Bulyan, FLTrust); any other aggregator, or attackers redrawn every round (their
  draw is the client transform's), is returned as it is."""
  if attacker.redraw or not robust.watches(aggregator):
    return aggregator
  inner = aggregator.aggregate
  assert inner is not None

  def aggregate(block, node_state, key):
    return inner(block, node_state, key, watch=attacker.mask(block.clients, None) & block.valid)

  return aggregator._replace(aggregate=aggregate)
