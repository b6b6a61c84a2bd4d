"""Robust aggregators: blockwise :class:`~fedtree.core.updates.Aggregator` s that replace a
parent's weighted mean by an estimate that a minority of poisoned updates cannot move far.

Every aggregator here sees every parent's whole cohort as one fixed-size
:class:`~fedtree.core.updates.Block` ``[P, K, ...]`` (``K`` the largest cohort of a parent; empty
slots masked by ``block.valid``) and runs one program over all parents of a level (the parent
axis is a batch axis of every operation). Each returns ``(delta_sum [P, ...], weight_sum [P],
stats {name: [P]})`` with ``delta_sum / weight_sum`` the robust estimate and ``weight_sum`` the
parent's total weight of valid updates (so a level above weighs the parent as it would under
the mean; ``0`` where a parent received nothing, which leaves it unchanged).

The estimates, with ``n`` a parent's number of valid updates:

* :func:`median`: coordinate-wise median (Yin et al. 2018), the mean of the two middle values
  when ``n`` is even (as ``numpy.median``);
* :func:`trimmed_mean`: coordinate-wise ``β``-trimmed mean (Yin et al. 2018): the
  ``floor(β n)`` largest and smallest values of each coordinate dropped, the rest averaged;
* :func:`krum`: Krum and multi-Krum (Blanchard et al. 2017): each update's score is the sum of
  its squared distances to its ``max(1, n - f - 2)`` nearest other updates
  (:func:`krum_neighbours`); the ``m`` best-scoring ones (``m = 1``: Krum; default ``n - f``)
  are averaged, each counted once (``weighted=False``, the paper's) or by the clients'
  aggregation weights (``weighted=True``: example counts under ``weighting="examples"``, Flower's
  multi-Krum);
* :func:`bulyan` (El Mhamdi et al. 2018): ``θ = n - 2f`` updates chosen by Krum one at a time
  (each removed from the candidates, the neighbour count ``max(1, r - f - 2)`` recounted on the
  ``r`` candidates left at every step), then per coordinate the mean of the ``θ - 2f`` values
  closest to the chosen ones' median;
* :func:`geometric_median`: RFA (Pillutla et al. 2022), the weighted geometric median by
  smoothed Weiszfeld iterations from the weighted mean;
* :func:`norm_bound`: every update scaled to norm at most ``τ``, then the weighted mean (Sun et
  al. 2019);
* :func:`fltrust`: FLTrust (Cao et al. 2021), updates weighted by their cosine to the server's
  own update on a root dataset (the updates of ``trusted`` children) and rescaled to its norm;
* :func:`centered_clip`: centered clipping (Karimireddy et al. 2021), ``v ← v + mean_i
  clip_τ(x_i - v)`` for a few iterations. The paper centres on the server's previous aggregate
  (its momentum); an aggregator here is stateless, so the centre is chosen by ``center``:
  ``"zero"`` (default: the first iteration is then norm bounding and a plain mean), ``"mean"``
  or ``"median"`` (the coordinate-wise median, a robust start).

Weights: :func:`geometric_median` and :func:`norm_bound` use the clients' aggregation weights;
the order-statistic and distance-based ones (median, trimmed mean, Krum, Bulyan, centered
clipping, FLTrust) count every valid update once, as their papers do; multi-Krum averages the
updates it keeps with the weights on request (``weighted=True``).

Against Flower's strategies (``flwr.server.strategy``): median, trimmed mean, Krum and Bulyan
(``Bulyan(num_malicious_clients=f)``, Krum as its first rule) choose and average as Flower's do.
Multi-Krum differs in two defaults: Flower's ``Krum`` keeps one update unless
``num_clients_to_keep`` is set, fedtree's ``multi_krum`` keeps ``n - f``; and Flower averages the
kept updates weighted by their example counts, fedtree's default counts each once: ``krum(f=f,
m=m, weighted=True)`` with ``weighting="examples"`` is Flower's ``Krum(num_malicious_clients=f,
num_clients_to_keep=m)``.

Parents with fewer updates than an aggregator's bound: Krum needs ``n >= 2f + 3`` and Bulyan
``n >= 4f + 3``. A block whose static size ``K`` is below the bound is refused when the round is
traced (before anything compiles). A parent whose *reported* updates fall below it in some
round (empty slots) is handled, not refused: Krum's neighbour count is
:func:`krum_neighbours` (at least 1, at most ``n - 1``) and ``m`` is clipped to ``[1, n]``;
Bulyan's ``θ`` to ``[1, n]`` and its kept count ``θ - 2f`` to ``[1, θ]``.

Stats (round metrics, the mean over the parents): ``trimmed`` (values dropped per coordinate),
``krum_selected`` / ``bulyan_selected`` (updates kept), ``norm_bounded`` / ``cclip_clipped``
(updates clipped), ``fltrust_zeroed`` (updates of trust score 0); with a ``watch`` mask of the
attackers' slots (:func:`watches`, passed by :func:`fedtree.toolbox.attacks.watch_kept`),
``kept_attackers``: the attackers among the updates Krum, Bulyan or FLTrust kept. Which slots
Krum and Bulyan keep: :func:`krum_selection`, :func:`bulyan_selection`.

Example:
  >>> import jax.numpy as jnp
  >>> from fedtree.core.updates import Block
  >>> x = jnp.array([[[0.0], [1.0], [2.0], [100.0]]])          # one parent, 4 clients, 1 coordinate
  >>> block = Block(x, jnp.ones((1, 4)), jnp.ones((1, 4), bool), jnp.arange(4)[None])
  >>> s, w, _ = median().aggregate(block, {}, None)
  >>> float(s[0, 0] / w[0])
  1.5
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from fedtree.core.updates import Aggregator, Block

PyTree = object

CENTERS = ("zero", "mean", "median")


# ------------------------------------------------------------------------ helpers
def _count(block: Block) -> jax.Array:
  return jnp.sum(block.valid, axis=1).astype(jnp.int32)


def _bcast(v: jax.Array, x: jax.Array) -> jax.Array:
  """``v [P, K]`` or ``[P]`` broadcast against ``x [P, K, ...]`` / ``[P, ...]``."""
  return v.reshape(v.shape + (1,) * (x.ndim - v.ndim))


def _weight_total(block: Block) -> jax.Array:
  return jnp.sum(jnp.where(block.valid, block.weights, 0), axis=1)


def _finish(estimate: PyTree, block: Block) -> tuple[PyTree, jax.Array]:
  """``(estimate * total weight, total weight)``: what the engine divides back."""
  total = _weight_total(block)
  return jax.tree.map(lambda e: e * _bcast(total, e).astype(e.dtype), estimate), total


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _masked_sort(x: jax.Array, valid: jax.Array) -> jax.Array:
  """``x [P, K, ...]`` sorted along the slots with invalid slots last (as ``+inf``)."""
  return jnp.sort(jnp.where(_bcast(valid, x), x, jnp.inf), axis=1)


def _take_rank(s: jax.Array, rank: jax.Array) -> jax.Array:
  """``s [P, K, ...]`` at slot ``rank [P]`` -> ``[P, ...]``."""
  idx = jnp.clip(rank, 0, s.shape[1] - 1).reshape((s.shape[0], 1) + (1,) * (s.ndim - 2))
  return jnp.take_along_axis(s, jnp.broadcast_to(idx, (s.shape[0], 1) + s.shape[2:]), axis=1)[:, 0]


def _leaf_median(x: jax.Array, valid: jax.Array, n: jax.Array) -> jax.Array:
  s = _masked_sort(x, valid)
  lo, hi = _take_rank(s, (n - 1) // 2), _take_rank(s, n // 2)
  return jnp.where(_bcast(n > 0, lo), (lo + hi) * 0.5, 0).astype(x.dtype)


def _masked_mean(x: jax.Array, keep: jax.Array) -> jax.Array:
  k = jnp.sum(keep, axis=1)
  total = jnp.sum(jnp.where(_bcast(keep, x), x, 0), axis=1)
  return total / _bcast(jnp.maximum(k, 1), total).astype(x.dtype)


def _sq_norms(deltas: PyTree) -> jax.Array:
  """``||x_pk||²`` of every slot: ``[P, K]``."""
  return jnp.asarray(sum(jnp.sum(jnp.square(d.reshape(d.shape[:2] + (-1,))), axis=-1)
                         for d in jax.tree.leaves(deltas)))


def pairwise_sq_distances(deltas: PyTree) -> jax.Array:
  """``||x_pi - x_pj||²`` for every parent's slots: ``[P, K, K]`` (by the Gram matrix: memory
  ``P K²``, not ``P K² D``; clipped at 0 against rounding)."""
  sq = _sq_norms(deltas)
  gram = sum(jnp.einsum("pid,pjd->pij", d.reshape(d.shape[:2] + (-1,)), d.reshape(d.shape[:2] + (-1,)),
                        precision=jax.lax.Precision.HIGHEST) for d in jax.tree.leaves(deltas))
  return jnp.maximum(sq[:, :, None] + sq[:, None, :] - 2.0 * gram, 0.0)


def krum_neighbours(r, f):
  """Krum's neighbour count among ``r`` candidates: ``max(1, r - f - 2)``, at most ``r - 1``
  (Blanchard et al. 2017's ``n - f - 2``, and never 0 while another candidate remains: a score
  over no neighbour is 0 for every candidate, and the pick would be whichever sits in the lowest
  slot, an attacker included). Flower's ``aggregate_krum`` counts the same."""
  return jnp.minimum(jnp.maximum(r - f - 2, 1), jnp.maximum(r - 1, 0))


def _krum_scores(dist: jax.Array, cand: jax.Array, f) -> jax.Array:
  """Krum's score of every candidate slot among the candidates ``cand [P, K]``: the sum of its
  squared distances to its :func:`krum_neighbours` nearest other candidates (``r`` their
  number, recounted at every call: Bulyan's selections shrink it); ``+inf`` for non-candidates."""
  k = dist.shape[-1]
  r = jnp.sum(cand, axis=1).astype(jnp.int32)
  nb = krum_neighbours(r, f)
  other = cand[:, None, :] & cand[:, :, None] & ~jnp.eye(k, dtype=bool)[None]
  s = jnp.sort(jnp.where(other, dist, jnp.inf), axis=-1)
  near = jnp.arange(k)[None, None, :] < nb[:, None, None]
  score = jnp.sum(jnp.where(near, s, 0.0), axis=-1)
  return jnp.where(cand, score, jnp.inf)


def _ranks(score: jax.Array) -> jax.Array:
  """Each slot's rank by ascending score, ties by slot order: ``[P, K]``."""
  order = jnp.argsort(score, axis=1, stable=True)
  return jnp.argsort(order, axis=1, stable=True)


def _check_f(name: str, f, bound: int, k: int) -> None:
  if _is_concrete(f) and k < bound:
    raise ValueError(f"{name}: f={int(f)} needs at least {bound} updates per parent, but the largest "
                     f"cohort of a parent is {k}; lower f or raise the cohort size")


def _check_nonneg_int(name: str, what: str, v) -> None:
  if _is_concrete(v) and (int(v) != v or v < 0):
    raise ValueError(f"{name}: {what}={v!r} must be a non-negative integer")


def _kept(kept: jax.Array, watch: jax.Array | None) -> dict[str, jax.Array]:
  """Stat ``kept_attackers``: how many of the slots ``kept [P, K]`` are watched (attackers)."""
  if watch is None:
    return {}
  return {"kept_attackers": jnp.sum(kept & watch, axis=1).astype(jnp.result_type(float))}


def _watching(aggregate: Callable) -> Callable:
  aggregate.watches = True   # type: ignore[attr-defined]
  return aggregate


def watches(aggregator: Aggregator) -> bool:
  """Whether ``aggregator`` chooses among the updates (Krum, multi-Krum, Bulyan, FLTrust) and can
  count how many of those it kept were attackers: its ``aggregate`` then takes a keyword
  ``watch`` (``bool [P, K]``, the attackers' slots) and adds the stat ``kept_attackers`` (per
  parent, the attackers among the updates it averaged; FLTrust: those with a positive trust
  score)."""
  return bool(getattr(aggregator.aggregate, "watches", False))


# ------------------------------------------------------------------------ aggregators
def mean() -> Aggregator:
  """The weighted mean as a blockwise aggregator (what an attack that rewrites a parent's cohort
  runs in front of when no defence is chosen)."""

  def aggregate(block, node_state, key):
    w = jnp.where(block.valid, block.weights, 0)
    s = jax.tree.map(lambda d: jnp.sum(_bcast(w, d).astype(d.dtype) * d, axis=1), block.deltas)
    return s, jnp.sum(w, axis=1), {}

  return Aggregator(aggregate, name="block_mean")


def median() -> Aggregator:
  """Coordinate-wise median of every parent's valid updates (unweighted)."""

  def aggregate(block, node_state, key):
    n = _count(block)
    est = jax.tree.map(lambda d: _leaf_median(d, block.valid, n), block.deltas)
    return (*_finish(est, block), {})

  return Aggregator(aggregate, name="median")


def trimmed_mean(*, beta: float) -> Aggregator:
  """Coordinate-wise trimmed mean: the ``floor(beta * n)`` smallest and largest values of every
  coordinate dropped, the rest averaged (unweighted). Stat ``trimmed``: values dropped per
  coordinate (both sides).

  Raises:
    ValueError: ``beta`` not in ``[0, 0.5)``.
  """
  if _is_concrete(beta) and not 0.0 <= float(beta) < 0.5:
    raise ValueError(f"trimmed_mean: beta={beta!r} must be in [0, 0.5) (the fraction trimmed on each side)")

  def aggregate(block, node_state, key):
    n = _count(block)
    fdtype = jnp.result_type(float)
    cut = jnp.floor(jnp.asarray(beta, fdtype) * n.astype(fdtype)).astype(jnp.int32)
    rank = jnp.arange(block.valid.shape[1])[None, :]
    keep = (rank >= cut[:, None]) & (rank < (n - cut)[:, None])
    est = jax.tree.map(lambda d: _masked_mean(_masked_sort(d, block.valid), keep), block.deltas)
    return (*_finish(est, block), {"trimmed": (2 * cut).astype(jnp.result_type(float))})

  return Aggregator(aggregate, name="trimmed_mean")


def krum_selection(block: Block, *, f, m=None) -> jax.Array:
  """Which slots (multi-)Krum averages: ``bool [P, K]`` (see :func:`krum`)."""
  n = _count(block)
  score = _krum_scores(pairwise_sq_distances(block.deltas), block.valid, f)
  m_eff = n - f if m is None else jnp.asarray(m, jnp.int32)
  m_eff = jnp.clip(m_eff, 1, jnp.maximum(n, 1))
  return (_ranks(score) < m_eff[:, None]) & block.valid


def krum(*, f: int | jax.Array, m: int | jax.Array | None = None, weighted: bool = False) -> Aggregator:
  """Krum (``m=1``) and multi-Krum: the mean of the ``m`` updates (default ``n - f``) with the
  smallest sum of squared distances to their ``max(1, n - f - 2)`` nearest others, ``f`` the
  number of Byzantine updates tolerated. Stat ``krum_selected``: how many were averaged.

  Args:
    f: the Byzantine updates tolerated.
    m: how many updates are averaged (``None``: ``n - f``).
    weighted: ``False`` (default, the paper's): every kept update counts once; ``True``: the
      kept updates are averaged with the clients' aggregation weights, which with
      ``weighting="examples"`` reproduces Flower's ``Krum(num_malicious_clients=f,
      num_clients_to_keep=m)`` (it weighs the kept updates by their example counts). Krum
      (``m=1``) is the same either way.

  Raises:
    ValueError: ``f`` or ``m`` not a non-negative integer (``m`` at least 1), ``weighted`` not a
      bool; at trace time, a block of fewer than ``2f + 3`` slots.
  """
  _check_nonneg_int("krum", "f", f)
  if not isinstance(weighted, bool):
    raise ValueError(f"krum: weighted={weighted!r} must be True (the kept updates averaged with the "
                     f"clients' weights, Flower's multi-Krum) or False (each counted once)")
  if m is not None:
    _check_nonneg_int("krum", "m", m)
    if _is_concrete(m) and m < 1:
      raise ValueError(f"krum: m={m!r} must be at least 1 (Krum: 1; multi-Krum: more)")

  def aggregate(block, node_state, key, watch=None):
    _check_f("krum", f, 2 * int(f) + 3 if _is_concrete(f) else 0, block.valid.shape[1])
    sel = krum_selection(block, f=f, m=m)
    if weighted:
      est = _weighted_point(block, jnp.where(sel, block.weights, 0))
    else:
      est = jax.tree.map(lambda d: _masked_mean(d, sel), block.deltas)
    stats = {"krum_selected": jnp.sum(sel, axis=1).astype(jnp.result_type(float)), **_kept(sel, watch)}
    return (*_finish(est, block), stats)

  return Aggregator(_watching(aggregate), name="krum" if m == 1 else "multi_krum", pairwise=True)


def bulyan_selection(block: Block, *, f) -> jax.Array:
  """The ``θ = n - 2f`` slots Bulyan's recursive Krum chooses: ``bool [P, K]``."""
  n = _count(block)
  dist = pairwise_sq_distances(block.deltas)
  theta = jnp.clip(n - 2 * f, 1, jnp.maximum(n, 1))

  def pick(t, chosen):
    cand = block.valid & ~chosen
    best = jnp.argmin(_krum_scores(dist, cand, f), axis=1)
    new = chosen | (jax.nn.one_hot(best, chosen.shape[1], dtype=bool) & cand)
    return jnp.where((t < theta)[:, None], new, chosen)

  return jax.lax.fori_loop(0, block.valid.shape[1], pick, jnp.zeros_like(block.valid))


def bulyan(*, f: int | jax.Array) -> Aggregator:
  """Bulyan: ``θ = n - 2f`` updates chosen by Krum one at a time, then per coordinate the mean of
  the ``θ - 2f`` chosen values closest to their median (ties by slot order).

  Raises:
    ValueError: ``f`` not a non-negative integer; at trace time, a block of fewer than ``4f + 3``
      slots.
  """
  _check_nonneg_int("bulyan", "f", f)

  def aggregate(block, node_state, key, watch=None):
    _check_f("bulyan", f, 4 * int(f) + 3 if _is_concrete(f) else 0, block.valid.shape[1])
    sel = bulyan_selection(block, f=f)
    theta = jnp.sum(sel, axis=1).astype(jnp.int32)
    keep_n = jnp.clip(theta - 2 * f, 1, jnp.maximum(theta, 1))

    def leaf(d):
      med = _leaf_median(d, sel, theta)
      dist = jnp.where(_bcast(sel, d), jnp.abs(d - med[:, None]), jnp.inf)
      order = jnp.argsort(dist, axis=1, stable=True)
      vals = jnp.take_along_axis(d, order, axis=1)
      keep = jnp.arange(d.shape[1])[None, :] < keep_n[:, None]
      return _masked_mean(vals, keep)

    est = jax.tree.map(leaf, block.deltas)
    stats = {"bulyan_selected": theta.astype(jnp.result_type(float)), **_kept(sel, watch)}
    return (*_finish(est, block), stats)

  return Aggregator(_watching(aggregate), name="bulyan", pairwise=True)


def _weighted_point(block: Block, coef: jax.Array) -> PyTree:
  """``Σ_k c_pk x_pk / Σ_k c_pk`` for every parent (0 where the coefficients sum to 0)."""
  c = jnp.where(block.valid, coef, 0)
  tot = jnp.sum(c, axis=1)
  safe = jnp.where(tot > 0, tot, 1)
  return jax.tree.map(lambda d: jnp.sum(_bcast(c, d).astype(d.dtype) * d, axis=1)
                      / _bcast(safe, d[:, 0]).astype(d.dtype), block.deltas)


def _dist_to(block: Block, point: PyTree) -> jax.Array:
  """``||x_pk - z_p||`` for every slot: ``[P, K]``."""
  sq = sum(jnp.sum(jnp.square((d - z[:, None]).reshape(d.shape[:2] + (-1,))), axis=-1)
           for d, z in zip(jax.tree.leaves(block.deltas), jax.tree.leaves(point), strict=True))
  return jnp.sqrt(sq)


def geometric_median(*, iterations: int = 8, nu: float = 1e-6) -> Aggregator:
  """RFA: the weighted geometric median ``argmin_z Σ_k w_k ||z - x_k||`` by ``iterations``
  smoothed Weiszfeld steps ``z ← Σ β_k x_k / Σ β_k``, ``β_k = w_k / max(ν, ||z - x_k||)``, from
  the weighted mean.

  Raises:
    ValueError: ``iterations`` < 1 or ``nu`` <= 0.
  """
  if int(iterations) < 1:
    raise ValueError(f"geometric_median: iterations={iterations!r} must be at least 1")
  if _is_concrete(nu) and not float(nu) > 0:
    raise ValueError(f"geometric_median: nu={nu!r} must be positive (the smoothing of the Weiszfeld step)")

  def aggregate(block, node_state, key):
    w = jnp.where(block.valid, block.weights, 0)

    def step(_, z):
      return _weighted_point(block, w / jnp.maximum(nu, _dist_to(block, z)))

    z = jax.lax.fori_loop(0, int(iterations), step, _weighted_point(block, w))
    return (*_finish(z, block), {})

  return Aggregator(aggregate, name="geometric_median")


def _clip_scale(norm: jax.Array, tau) -> jax.Array:
  return jnp.minimum(1.0, tau / jnp.maximum(norm, 1e-30))


def _check_tau(name: str, tau) -> None:
  if _is_concrete(tau) and not float(tau) > 0:
    raise ValueError(f"{name}: tau={tau!r} must be positive (the norm bound)")


def norm_bound(*, tau: float) -> Aggregator:
  """Every update scaled to norm at most ``tau``, then the weighted mean. Stat ``norm_bounded``:
  how many updates were scaled down."""
  _check_tau("norm_bound", tau)

  def aggregate(block, node_state, key):
    norm = jnp.sqrt(_sq_norms(block.deltas))
    w = jnp.where(block.valid, block.weights, 0) * _clip_scale(norm, tau)
    s = jax.tree.map(lambda d: jnp.sum(_bcast(w, d).astype(d.dtype) * d, axis=1), block.deltas)
    clipped = jnp.sum((norm > tau) & block.valid, axis=1).astype(jnp.result_type(float))
    return s, _weight_total(block), {"norm_bounded": clipped}

  return Aggregator(aggregate, name="norm_bound")


def centered_clip(*, tau: float, iterations: int = 1, center: str = "zero") -> Aggregator:
  """Centered clipping: ``v ← v + (1/n) Σ_k clip_τ(x_k - v)`` for ``iterations`` steps from
  ``center`` (``"zero"``, ``"mean"``: the unweighted mean, or ``"median"``: the coordinate-wise
  median; see the module docstring). Stat ``cclip_clipped``: updates clipped in the last step.

  Raises:
    ValueError: ``tau`` <= 0, ``iterations`` < 1 or an unknown ``center``.
  """
  _check_tau("centered_clip", tau)
  if int(iterations) < 1:
    raise ValueError(f"centered_clip: iterations={iterations!r} must be at least 1")
  if center not in CENTERS:
    raise ValueError(f"centered_clip: center={center!r}; choose one of {list(CENTERS)}")

  def aggregate(block, node_state, key):
    n = _count(block)
    if center == "zero":
      v = jax.tree.map(lambda d: jnp.zeros_like(d[:, 0]), block.deltas)
    elif center == "mean":
      v = jax.tree.map(lambda d: _masked_mean(d, block.valid), block.deltas)
    else:
      v = jax.tree.map(lambda d: _leaf_median(d, block.valid, n), block.deltas)

    def step(_, carry):
      v, _clipped = carry
      dist = _dist_to(block, v)
      c = jnp.where(block.valid, _clip_scale(dist, tau), 0)
      v = jax.tree.map(lambda d, z: z + jnp.sum(_bcast(c, d).astype(d.dtype) * (d - z[:, None]), axis=1)
                       / _bcast(jnp.maximum(n, 1), z).astype(d.dtype), block.deltas, v)
      return v, jnp.sum((dist > tau) & block.valid, axis=1).astype(jnp.result_type(float))

    v, clipped = jax.lax.fori_loop(0, int(iterations), step, (v, jnp.zeros(n.shape, jnp.result_type(float))))
    return (*_finish(v, block), {"cclip_clipped": clipped})

  return Aggregator(aggregate, name="centered_clip")


def fltrust(*, trusted: Sequence[int]) -> Aggregator:
  """FLTrust (Cao et al. 2021): the server's own update ``g₀`` on a root dataset it holds is the
  reference; every other update ``x_k`` gets the trust score ``s_k = ReLU(cos(x_k, g₀))``, is
  rescaled to ``g₀``'s norm, and the estimate is ``Σ_k s_k ||g₀|| x_k / ||x_k|| / Σ_k s_k``
  (0 where every score is 0).

  The root dataset is the data of the ``trusted`` children (e.g. a few clients whose data the
  server holds): ``g₀`` is the unweighted mean of a parent's trusted updates, which are not
  aggregated themselves. A parent whose cohort holds no trusted update has no reference: it is
  left unchanged this round (weight 0). Stat ``fltrust_zeroed``: updates with trust score 0.

  Args:
    trusted: the children (clients, or nodes of the level below) whose updates are the server's.

  Raises:
    ValueError: no trusted id, or a negative one.
  """
  ids = tuple(int(i) for i in trusted)
  if not ids or min(ids) < 0:
    raise ValueError(f"fltrust: trusted={list(trusted)!r} must name at least one child (ids >= 0) whose "
                     f"update is the server's root-data update")

  def aggregate(block, node_state, key, watch=None):
    root = jnp.isin(block.clients, jnp.asarray(ids, jnp.int32)) & block.valid
    others = block.valid & ~root
    has_root = jnp.any(root, axis=1)
    g0 = jax.tree.map(lambda d: _masked_mean(d, root), block.deltas)
    g0_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.reshape(g.shape[0], -1)), axis=1)
                           for g in jax.tree.leaves(g0)))
    norms = jnp.sqrt(_sq_norms(block.deltas))
    dot = sum(jnp.einsum("pkd,pd->pk", d.reshape(d.shape[:2] + (-1,)), g.reshape(g.shape[0], -1),
                         precision=jax.lax.Precision.HIGHEST)
              for d, g in zip(jax.tree.leaves(block.deltas), jax.tree.leaves(g0), strict=True))
    score = jnp.where(others, jax.nn.relu(dot / jnp.maximum(norms * g0_norm[:, None], 1e-30)), 0.0)
    coef = score * g0_norm[:, None] / jnp.maximum(norms, 1e-30)
    tot = jnp.sum(score, axis=1)
    est = jax.tree.map(lambda d: jnp.sum(_bcast(coef, d).astype(d.dtype) * d, axis=1)
                       / _bcast(jnp.where(tot > 0, tot, 1), d[:, 0]).astype(d.dtype), block.deltas)
    weight = jnp.where(has_root, jnp.sum(jnp.where(others, block.weights, 0), axis=1), 0)
    s = jax.tree.map(lambda e: e * _bcast(weight, e).astype(e.dtype), est)
    stats = {"fltrust_zeroed": jnp.sum(others & (score <= 0), axis=1).astype(jnp.result_type(float)),
             **_kept(score > 0, watch)}
    return s, weight, stats

  return Aggregator(_watching(aggregate), name="fltrust")
