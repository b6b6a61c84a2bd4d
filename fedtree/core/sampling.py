"""Cohort sampling with static shapes: a fixed number of children per parent node.

For every parent node ``g`` with ``size_g`` children the cohort holds ``k_g`` of them, drawn
uniformly without replacement; ``k_g == size_g`` takes them all. The cohort is a flat,
static-length array of client indices grouped by parent, padded with invalid slots to a
multiple of the chunk size; where each slot's parent lies is static, only which child fills
it is random. Shapes therefore never change between rounds.

**A draw's cost does not grow with the population.** A small parent is shuffled whole (a random
key per child, one sort). A parent of many children (at least :data:`DRAW_FROM` and four times
the draws it needs) never touches the others: its ``k_g`` children are the first ``k_g``
distinct values of ``m_g`` draws with replacement (``m_g`` from a tail bound on the draws that
``k_g`` distinct values take, so that fewer is rare), and the whole draw is repeated, from a new
key, in the rare round where some parent saw fewer. The first ``k`` distinct values of i.i.d.
uniform draws are a uniform ordered sample without replacement, and which values they are does
not depend on where the repeats fell, so accepting a draw only when it holds ``k`` distinct
values keeps that distribution exactly (rejection sampling): the cohort's distribution is the
same as shuffling the parent whole, at ``O(m log m)`` cost, ``m`` about ``k`` when the parent is
much larger than its cohort.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Cohort(NamedTuple):
  """A sampled cohort, padded to ``K = num_chunks · chunk_size`` slots.

  Attributes:
    clients: ``int32[K]`` child index of each slot (a valid index even in padding slots).
    parent: ``int32[K]`` parent node of each slot.
    valid: ``bool[K]``, false for padding slots.
    rows: ``int32[K]`` each slot's row in the per-client arrays the round holds (its data and its
      paged state) where they hold a window of the population rather than every client
      (:meth:`fedtree.core.data.FederatedData.windowed`); ``None``: the client's own index.
  """

  clients: jax.Array
  parent: jax.Array
  valid: jax.Array
  rows: jax.Array | None = None

  @property
  def row(self) -> jax.Array:
    """``int32[K]`` each slot's row in the per-client arrays (its client's index when they hold
    every client)."""
    return self.clients if self.rows is None else self.rows

  def scatter(self, base, values, mask: jax.Array | None = None):
    """``base`` (a pytree of ``[C, ...]`` per-client arrays, or of a window's rows) with slot ``s``'s
    row (:attr:`row`) set to ``values[s]`` for every slot ``s`` of ``mask`` (default ``valid``:
    padding slots write nowhere). ``values`` is a pytree like ``base`` of ``[K, ...]`` slot values,
    or a scalar broadcast to every written row.

    Example:
      >>> cohort = Cohort(clients=jnp.array([3, 1, 0]), parent=jnp.zeros(3, jnp.int32),
      ...                 valid=jnp.array([True, True, False]))
      >>> cohort.scatter(jnp.zeros(4), jnp.array([5.0, 7.0, 9.0])).tolist()
      [0.0, 7.0, 0.0, 5.0]
    """
    leaves = jax.tree.leaves(base)
    if not leaves:
      return base
    mask = self.valid if mask is None else mask
    idx = jnp.where(mask, self.row, leaves[0].shape[0])
    return jax.tree.map(lambda b, v: b.at[idx].set(v, mode="drop"), base, values)


DRAW_FROM = 1024
"""Children from which a parent draws its cohort without touching the others (with ``"auto"``,
:attr:`CohortSampler.method`); a smaller parent is shuffled whole, which costs about as much as
the draws on CPU (0.4 ms at 1,000) and keeps the draws of the releases before it bit for bit (every
shipped config's populations are below it)."""

REDRAW_PROBABILITY = 1e-9
"""The probability, per round, that a draw of the parents that draw their cohort holds fewer
distinct children than a cohort and is drawn again (the draws per parent are sized for it)."""

METHODS = ("auto", "draw", "shuffle")
"""How a :class:`CohortSampler` draws: ``"shuffle"`` every parent whole (a random key per child,
one sort: time grows with the population), ``"draw"`` every parent whose cohort is not all of it
by draws with replacement and rejection (time grows with the cohort only), ``"auto"`` a parent
of at least :data:`DRAW_FROM` children and four times its draws by draws, the others whole."""


def draws_needed(n: int, k: int, tail: float) -> int:
  """The smallest ``m`` such that ``m`` uniform draws with replacement from ``n`` values hold
  ``k`` distinct ones except with probability at most ``tail``: the draws that ``k`` distinct
  values take are a sum of geometric variables of success probabilities ``(n - i) / n``, ``i <
  k``, mean ``mu``, whose tail Janson (2018, "Tail bounds for sums of geometric and exponential
  variables", Thm. 2.1) bounds by ``P(T >= lam mu) <= lam^-1 (1 - p)^(mu (lam - 1 - ln lam))``,
  ``p = (n - k + 1) / n`` the smallest success probability.

  Example:
    >>> draws_needed(10**6, 100, 1e-9), draws_needed(10**6, 1, 1e-9), draws_needed(48, 16, 1e-9)
    (122, 1, 56)
  """
  n, k = int(n), int(k)
  if k <= 1:
    return k
  if k > n:
    raise ValueError(f"k={k} distinct values of n={n}")
  mu = float(np.sum(n / (n - np.arange(k, dtype=np.float64))))
  log_q = math.log((k - 1) / n)   # ln(1 - p)
  target = math.log(tail)

  def log_bound(m: int) -> float:   # ln of the bound on P(T >= m + 1), T the draws k values take
    lam = (m + 1) / mu
    return -math.log(lam) + mu * (lam - 1 - math.log(lam)) * log_q if lam > 1 else 0.0

  lo, hi = k, max(k + 1, int(math.ceil(mu)))
  while log_bound(hi) > target:
    lo, hi = hi, 2 * hi
  while lo < hi:   # the bound decreases in m above mu
    mid = (lo + hi) // 2
    if log_bound(mid) <= target:
      hi = mid
    else:
      lo = mid + 1
  return hi


@dataclasses.dataclass(frozen=True)
class CohortSampler:
  """Samples ``k_g`` children of every parent ``g``; build with :func:`cohort_sampler`.

  ``method`` (:data:`METHODS`) and ``redraw_probability`` (:data:`REDRAW_PROBABILITY`) change
  the cost of a draw, never its distribution (the module docstring)."""

  parent: tuple[int, ...]        # parent of every child (static)
  sizes: tuple[int, ...]         # k_g per parent
  chunk_size: int                # padded length is a multiple of this
  method: str = "auto"           # one of METHODS
  redraw_probability: float = REDRAW_PROBABILITY

  @functools.cached_property
  def _static(self):
    parent = np.asarray(self.parent, dtype=np.int32)
    num_parents = len(self.sizes)
    counts = np.bincount(parent, minlength=num_parents)
    order = np.argsort(parent, kind="stable").astype(np.int32)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    k = np.asarray(self.sizes, dtype=np.int32)
    slot_parent = np.repeat(np.arange(num_parents, dtype=np.int32), k)
    slot_pos = np.concatenate([start[g] + np.arange(k[g]) for g in range(num_parents)]).astype(np.int32)
    total = int(k.sum())
    padded = -(-total // self.chunk_size) * self.chunk_size
    pad = padded - total
    full = bool(np.all(k == counts))
    return dict(order=order, identity=bool(np.array_equal(order, np.arange(order.size))),
                slot_parent=slot_parent, slot_pos=slot_pos, total=total, pad=pad, full=full,
                draw=None if full else self._draw_plan(counts, start, k))

  def _draw_plan(self, counts: np.ndarray, start: np.ndarray, k: np.ndarray) -> dict | None:
    """The static layout of a draw in which some parents draw with replacement (``None``: every
    parent is shuffled whole, as ``method="shuffle"``). Entries, grouped by parent: a drawing
    parent's ``m_g`` draws (a child ``start_g + randint(n_g)``, ranked by draw index), a shuffled
    parent's ``n_g`` children (ranked by a random key)."""
    if self.method not in METHODS:
      raise ValueError(f"method={self.method!r}; choose one of {METHODS}")
    if not 0 < float(self.redraw_probability) < 1:
      raise ValueError(f"redraw_probability={self.redraw_probability!r}; it must be in (0, 1)")
    if self.method == "shuffle":
      return None
    tail = float(self.redraw_probability) / len(k)   # (a union bound over the parents)
    m = [draws_needed(int(n), int(kg), tail) if kg < n else 0 for n, kg in zip(counts, k, strict=True)]
    if self.method == "draw":
      draws = [kg < n for n, kg in zip(counts, k, strict=True)]
    else:
      draws = [kg < n and n >= DRAW_FROM and n >= 4 * mg for n, kg, mg in zip(counts, k, m, strict=True)]
    if not any(draws):
      return None
    length = [m[g] if draws[g] else int(counts[g]) for g in range(len(k))]
    entry_parent = np.repeat(np.arange(len(k), dtype=np.int32), length)
    first = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    idx = np.arange(entry_parent.size, dtype=np.int64) - first[entry_parent]   # index inside its parent
    drawn = np.asarray(draws)[entry_parent]
    base = np.where(drawn, start[entry_parent], start[entry_parent] + idx).astype(np.int32)
    span = np.where(drawn, counts[entry_parent], 1).astype(np.int32)
    slot_pos = np.concatenate([first[g] + np.arange(k[g]) for g in range(len(k))]).astype(np.int32)
    return dict(parent=entry_parent, base=base, span=span, drawn=drawn, index=idx.astype(np.uint32),
                slot_pos=slot_pos)

  def _drawn_clients(self, key: jax.Array) -> jax.Array:
    """``int32[total]`` the cohort's clients by draws with replacement and rejection (the module
    docstring): each attempt from ``fold_in(key, attempt)``, the first whose every parent saw
    ``k_g`` distinct children."""
    s = self._static
    plan = s["draw"]
    order = jnp.asarray(s["order"])
    entry_parent, base, span, drawn, index, slot_pos = (
      jnp.asarray(plan[f]) for f in ("parent", "base", "span", "drawn", "index", "slot_pos"))
    num = base.shape[0]

    def attempt(i):
      k_pos, k_rank = jax.random.split(jax.random.fold_in(key, i))
      pos = base + jnp.where(drawn, jax.random.randint(k_pos, (num,), 0, span, jnp.int32), 0)
      rank = jnp.where(drawn, index, jax.random.bits(k_rank, (num,), jnp.uint32))
      by_pos = jnp.lexsort((rank, pos))   # the same child together, its first draw first
      sorted_pos = jnp.take(pos, by_pos)
      first = jnp.concatenate([jnp.ones((1,), bool), sorted_pos[1:] != sorted_pos[:-1]])
      kept = jnp.zeros((num,), bool).at[by_pos].set(first)
      # grouped by parent, its distinct children first, in draw (or random) order
      chosen = jnp.take(jnp.lexsort((rank, jnp.logical_not(kept), entry_parent)), slot_pos)
      return jnp.take(pos, chosen), jnp.all(jnp.take(kept, chosen))

    picked, ok = attempt(0)
    picked, _, _ = jax.lax.while_loop(lambda c: jnp.logical_not(c[1]),
                                      lambda c: (*attempt(c[2]), c[2] + 1), (picked, ok, jnp.int32(1)))
    # (``order`` read once, after the loop: inside it the whole int32[C] array would be made every round)
    return picked if s["identity"] else jnp.take(order, picked)

  @property
  def parent_aligned(self) -> bool:
    """Whether every chunk holds children of a single parent (one parent, or every
    parent's cohort a multiple of the chunk): ``train_cohort(parent_aligned=...)``."""
    return len(self.sizes) == 1 or all(k % self.chunk_size == 0 for k in self.sizes)

  @property
  def cohort_size(self) -> int:
    """Number of real (non-padding) slots."""
    return self._static["total"]

  @property
  def padded_size(self) -> int:
    return self._static["total"] + self._static["pad"]

  def __call__(self, key: jax.Array) -> Cohort:
    s = self._static
    parent = jnp.asarray(np.asarray(self.parent, dtype=np.int32))
    if s["full"]:
      clients = jnp.asarray(s["order"])[s["slot_pos"]]
    elif s["draw"] is not None:
      clients = self._drawn_clients(key)
    else:
      u = jax.random.uniform(key, (len(self.parent),))
      shuffled = jnp.lexsort((u, parent))  # grouped by parent, random order inside a group
      clients = shuffled[s["slot_pos"]]
    slot_parent = jnp.asarray(s["slot_parent"])
    valid = jnp.ones((s["total"],), bool)
    if s["pad"]:
      clients = jnp.concatenate([clients, jnp.zeros((s["pad"],), jnp.int32)])
      slot_parent = jnp.concatenate([slot_parent, jnp.zeros((s["pad"],), jnp.int32)])
      valid = jnp.concatenate([valid, jnp.zeros((s["pad"],), bool)])
    return Cohort(clients=clients.astype(jnp.int32), parent=slot_parent, valid=valid)


def cohort_sampler(parent, cohort_size, *, chunk_size: int | None = None, method: str = "auto"
                   ) -> CohortSampler:
  """Builds a sampler for children with parents ``parent`` (numpy ``int[N]``).

  Args:
    parent: parent index of every child.
    cohort_size: children per parent: an int for every parent, ``None`` or ``-1`` for all of
      them, or a sequence with one entry per parent.
    chunk_size: pad the cohort to a multiple of this: an int, ``None`` (the whole cohort, no
      padding), ``"auto"`` (the per-backend default of :mod:`fedtree.core.tuning`) or a
      :func:`fedtree.core.tuning.chunk_policy` (the default sized for a model).
    method: how a cohort is drawn (:data:`METHODS`: its cost, never its distribution).

  Raises:
    ValueError: a cohort larger than its group, non-positive sizes, an unknown method.
  """
  if method not in METHODS:
    raise ValueError(f"method={method!r}; choose one of {METHODS}")
  parent = np.asarray(parent, dtype=np.int64)
  num_parents = int(parent.max()) + 1
  counts = np.bincount(parent, minlength=num_parents)
  if cohort_size is None or (np.isscalar(cohort_size) and int(np.asarray(cohort_size)) == -1):
    k = counts.copy()
  elif np.isscalar(cohort_size):
    k = np.full(num_parents, int(np.asarray(cohort_size)))
  else:
    k = np.asarray(cohort_size, dtype=np.int64)
    if k.shape != (num_parents,):
      raise ValueError(f"cohort_size has {k.size} entries for {num_parents} parent nodes")
  if k.min() < 1:
    raise ValueError(f"cohort_size={k.min()} must be >= 1 (or -1 for the whole group)")
  too_big = np.flatnonzero(k > counts)
  if too_big.size:
    g = int(too_big[0])
    raise ValueError(
      f"cohort_size={int(k[g])} exceeds group {g}, which has {int(counts[g])} clients "
      f"(smallest group: {int(counts.min())}); use cohort_size <= {int(counts.min())} or -1 for all"
    )
  return CohortSampler(parent=tuple(int(p) for p in parent), sizes=tuple(int(v) for v in k),
                       chunk_size=_chunk(chunk_size, k), method=method)


def _chunk(chunk_size, k: np.ndarray) -> int:
  """The chunk of a cohort with ``k[g]`` slots per parent from ``chunk_size`` (an int, ``None``,
  ``"auto"`` or a :func:`fedtree.core.tuning.chunk_policy`)."""
  total = int(k.sum())
  if callable(chunk_size):  # a policy (fedtree.core.tuning.chunk_policy): slots, devices -> chunk
    from fedtree.core.sharding import mesh_size

    chunk_size = int(chunk_size(total, mesh_size(), tuple(int(v) for v in k)))
  if isinstance(chunk_size, str):
    if chunk_size != "auto":
      raise ValueError(
        f"chunk_size={chunk_size!r}; choose an int >= 1, None (whole cohort) or 'auto' "
        f"('tune' is resolved by the fedavg/fedopt/hierfavg builders)"
      )
    from fedtree.core.sharding import mesh_size
    from fedtree.core.tuning import default_chunk_size

    chunk_size = default_chunk_size(total, num_devices=mesh_size(), group_sizes=tuple(int(v) for v in k))
  chunk = total if chunk_size is None else int(chunk_size)
  if chunk < 1:
    raise ValueError(f"chunk_size={chunk_size} must be >= 1")
  return min(chunk, total)


def _binomial_quantile(n: int, q: float, tail: float) -> int:
  """The smallest ``m`` with ``P(Binomial(n, q) > m) <= tail`` (log-space pmf; no scipy)."""
  if q >= 1:
    return n
  logs = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(q)
          + (n - k) * math.log1p(-q) for k in range(n + 1)]
  top = max(logs)
  pmf = np.exp(np.asarray(logs) - top)
  pmf /= pmf.sum()
  above = np.cumsum(pmf[::-1])[::-1]   # above[m] = P(X >= m)
  for m in range(n + 1):
    if m == n or above[m + 1] <= tail:
      return m
  return n


@dataclasses.dataclass(frozen=True)
class PoissonSampler(CohortSampler):
  """Poisson sampling in static shapes: every child takes part independently with probability
  ``rate``; each parent has ``sizes[g]`` slots (the maximum it may fill), the sampled children
  first and the rest masked (``valid`` false). A draw with more children than slots is an error
  at run time naming ``rate`` and the slot count, never a silent truncation. Build with
  :func:`poisson_sampler`."""

  rate: float = 1.0
  slots_name: str = "max_slots"   # the slots' name in the overflow error (a run's cohort_size)

  def __call__(self, key: jax.Array) -> Cohort:
    s = self._static
    parent = jnp.asarray(np.asarray(self.parent, dtype=np.int32))
    num_parents = len(self.sizes)
    u = jax.random.uniform(key, (len(self.parent),))
    take = u < self.rate
    # grouped by parent, the sampled children first, in random order
    shuffled = jnp.lexsort((u, jnp.logical_not(take), parent))
    clients = shuffled[s["slot_pos"]]
    count = jax.ops.segment_sum(take.astype(jnp.int32), parent, num_segments=num_parents)
    slot_parent = jnp.asarray(s["slot_parent"])
    first = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
    rank = jnp.arange(s["total"], dtype=jnp.int32) - jnp.asarray(first[s["slot_parent"]], jnp.int32)
    valid = rank < count[slot_parent]
    jax.debug.callback(functools.partial(_check_overflow, self.rate, self.sizes, self.slots_name), count)
    if s["pad"]:
      clients = jnp.concatenate([clients, jnp.zeros((s["pad"],), jnp.int32)])
      slot_parent = jnp.concatenate([slot_parent, jnp.zeros((s["pad"],), jnp.int32)])
      valid = jnp.concatenate([valid, jnp.zeros((s["pad"],), bool)])
    return Cohort(clients=clients.astype(jnp.int32), parent=slot_parent, valid=valid)


def _check_overflow(rate: float, slots: tuple[int, ...], slots_name: str, count) -> None:
  over = np.flatnonzero(np.asarray(count) > np.asarray(slots))
  if over.size:
    g = int(over[0])
    raise ValueError(f"Poisson sampling with q={rate!r} drew {int(np.asarray(count)[g])} clients under "
                     f"parent {g}, which has {slots[g]} slots; raise {slots_name} (none is dropped silently)")


def overflow_probability(counts, rate: float, slots) -> np.ndarray:
  """``P(Binomial(n_g, q) > k_g)`` for every parent ``g``: the probability per round that Poisson
  sampling with rate ``q`` draws more of its ``n_g`` children than its ``k_g`` slots (float64
  ``[G]``; log-space pmf, no scipy)."""
  out = []
  for n, k in zip(np.atleast_1d(counts), np.broadcast_to(np.asarray(slots), np.shape(np.atleast_1d(counts))),
                  strict=True):
    n, k = int(n), int(k)
    if k >= n or rate <= 0:
      out.append(0.0)
      continue
    if rate >= 1:
      out.append(1.0)
      continue
    logs = np.asarray([math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * math.log(rate)
                       + (n - j) * math.log1p(-rate) for j in range(k + 1, n + 1)])
    top = logs.max()
    out.append(float(math.exp(top) * np.exp(logs - top).sum()))
  return np.asarray(out, np.float64)


def poisson_sampler(parent, rate: float, *, max_slots=None, overflow_probability: float = 1e-12,
                    chunk_size: int | None = None, slots_name: str = "max_slots") -> PoissonSampler:
  """A :class:`PoissonSampler` of the children with parents ``parent``.

  Args:
    parent: parent index of every child.
    rate: ``q`` in (0, 1], every child's probability of taking part in a round.
    max_slots: slots per parent (an int, or one per parent); default the smallest count whose
      overflow probability per round is at most ``overflow_probability`` (at most the group).
    overflow_probability: the default slots' overflow probability per parent and round.
    chunk_size: as :func:`cohort_sampler`'s.
    slots_name: what the caller calls ``max_slots`` (e.g. ``"cohort_size"``, a run's field), in
      the error messages.

  Raises:
    ValueError: ``rate`` outside (0, 1], a slot count < 1, or more slots than a parent has
      children.
  """
  if not (isinstance(rate, (int, float, np.floating)) and 0 < float(rate) <= 1):
    raise ValueError(f"Poisson sampling rate q={rate!r}; it must be in (0, 1]")
  parent = np.asarray(parent, dtype=np.int64)
  counts = np.bincount(parent, minlength=int(parent.max()) + 1)
  if max_slots is None:
    k = np.asarray([max(1, _binomial_quantile(int(n), float(rate), overflow_probability)) for n in counts])
  else:
    k = np.asarray(max_slots, dtype=np.int64)
    if k.ndim and k.shape != counts.shape:
      raise ValueError(f"{slots_name} has {k.size} entries for {counts.size} parent nodes")
    k = np.broadcast_to(k, counts.shape)
    if k.min() < 1:
      raise ValueError(f"{slots_name}={max_slots!r}; it must be >= 1")
    too_big = np.flatnonzero(k > counts)
    if too_big.size:
      g = int(too_big[0])
      raise ValueError(f"{slots_name}={int(k[g])} (Poisson slots per parent) exceeds group {g}, which has "
                       f"{int(counts[g])} clients (smallest group: {int(counts.min())}); use {slots_name} <= "
                       f"{int(counts.min())}, one entry per parent, or leave it unset (slots from q)")
  return PoissonSampler(parent=tuple(int(p) for p in parent), sizes=tuple(int(v) for v in k),
                        chunk_size=_chunk(chunk_size, k), rate=float(rate), slots_name=slots_name)


# ------------------------------------------------------------------------ sampling strategies
# Besides uniform sampling (``CohortSampler.__call__``), strategies that draw the same static
# slots by other rules; each returns a ``Cohort`` laid out exactly as ``sampler(key)`` would be.

SAMPLING = ("uniform", "poisson", "data_size", "available", "power_of_choice")
"""The strategies :func:`fedtree.algorithms.host.hierfavg.hierfavg` takes as ``sampling=``."""


def check_sampling(sampling: str) -> str:
  """Raises a ``ValueError`` naming ``sampling`` unless it is one of :data:`SAMPLING`."""
  if sampling not in SAMPLING:
    raise ValueError(f"sampling={sampling!r}; choose one of {SAMPLING}")
  return sampling


def _pad(sampler: CohortSampler, clients: jax.Array, valid: jax.Array) -> Cohort:
  """``sampler``'s slot layout around ``clients`` / ``valid`` of its real slots."""
  s = sampler._static
  slot_parent = jnp.asarray(s["slot_parent"])
  if s["pad"]:
    clients = jnp.concatenate([clients, jnp.zeros((s["pad"],), jnp.int32)])
    slot_parent = jnp.concatenate([slot_parent, jnp.zeros((s["pad"],), jnp.int32)])
    valid = jnp.concatenate([valid, jnp.zeros((s["pad"],), bool)])
  return Cohort(clients=clients.astype(jnp.int32), parent=slot_parent, valid=valid)


def weighted_cohort(sampler: CohortSampler, key: jax.Array, weights: jax.Array) -> Cohort:
  """``k_g`` children of every parent drawn without replacement with probability proportional
  to ``weights`` at every draw (successive sampling; Efraimidis and Spirakis' keys
  ``log w + Gumbel``, so one sort draws every parent's cohort at once).

  ``weights`` ``[N]`` (>= 0, e.g. every child's examples, or an on-line mask for
  availability-aware sampling): a child of weight 0 is never drawn, and a slot left with no
  child of positive weight is invalid (the cohort shrinks rather than change shape). With equal
  weights this is uniform sampling; with ``k_g = 1`` a child is drawn with probability
  ``w_i / Σ_g w``; for ``k_g > 1`` inclusion probabilities are those of successive sampling
  (less than proportional for the heaviest children).

  Example:
    >>> sampler = cohort_sampler([0, 0, 0, 1, 1], 1)
    >>> cohort = weighted_cohort(sampler, jax.random.key(0), jnp.array([0.0, 0.0, 5.0, 1.0, 0.0]))
    >>> cohort.clients.tolist(), cohort.valid.tolist()
    ([2, 3], [True, True])
  """
  s = sampler._static
  parent = jnp.asarray(np.asarray(sampler.parent, dtype=np.int32))
  weights = jnp.asarray(weights, jnp.float32)
  gumbel = jax.random.gumbel(key, (len(sampler.parent),), jnp.float32)
  score = jnp.where(weights > 0, jnp.log(jnp.where(weights > 0, weights, 1.0)) + gumbel, -jnp.inf)
  order = jnp.lexsort((-score, parent))      # grouped by parent, best key first
  clients = order[jnp.asarray(s["slot_pos"])].astype(jnp.int32)
  return _pad(sampler, clients, jnp.take(weights, clients) > 0)


def top_scores(sampler: CohortSampler, candidates: Cohort, scores: jax.Array, key: jax.Array | None = None
               ) -> Cohort:
  """The ``k_g`` valid candidates of highest ``scores`` of every parent ``g``, in ``sampler``'s
  layout (power-of-choice: the highest local losses of a larger candidate set).

  Args:
    sampler: the cohort's sampler (``k_g`` per parent).
    candidates: a cohort with at least ``k_g`` slots of every parent (e.g. a sampler with
      ``d_g >= k_g``); invalid slots are never chosen.
    scores: ``[D]`` one score per candidate slot.
    key: breaks ties at random (``None``: the first slot wins).
  """
  s = sampler._static
  num_parents = len(sampler.sizes)
  score = jnp.where(candidates.valid, jnp.asarray(scores, jnp.float32), -jnp.inf)
  tie = (jnp.arange(score.shape[0], dtype=jnp.float32) if key is None
         else jax.random.uniform(key, score.shape))
  order = jnp.lexsort((tie, -score, candidates.parent))
  sorted_parent = jnp.take(candidates.parent, order)
  first = jnp.searchsorted(sorted_parent, jnp.arange(num_parents), side="left")
  slot_parent = jnp.asarray(s["slot_parent"])
  slot_start = np.concatenate([[0], np.cumsum(sampler.sizes)[:-1]])
  rank = np.arange(s["total"]) - slot_start[s["slot_parent"]]
  pick = jnp.take(order, jnp.take(first, slot_parent) + jnp.asarray(rank, jnp.int32))
  ok = jnp.take(candidates.valid, pick) & jnp.isfinite(jnp.take(score, pick)) & (
    jnp.take(candidates.parent, pick) == slot_parent)
  return _pad(sampler, jnp.take(candidates.clients, pick), ok)


def candidate_losses(model, parent_params, candidates: Cohort, data, *, chunk_size: int | None = None
                     ) -> jax.Array:
  """``float32[D]`` every candidate's mean training loss under its parent's model (power of
  choice, Cho et al. 2022: one forward pass over each candidate's examples).

  On padded data the candidates are scored at once (``chunk_size=None``) or ``chunk_size`` at a
  time. On ragged data (:attr:`~fedtree.core.data.FederatedData.train_offset`) each candidate
  reads its rows ``offset .. offset + ragged_max_train`` of the flat arrays (rows past its count
  masked), ``chunk_size`` candidates at a time (default: all), so memory is ``chunk_size`` of the
  largest client, never the padded ``[C, M]`` layout.
  """
  from fedtree.core.metrics import client_sums

  if data.ragged:
    width = jnp.arange(data.ragged_max_train, dtype=jnp.int32)
    last = data.x_train.shape[0] - 1
    x_flat, y_flat, offset = (jnp.asarray(a) for a in (data.x_train, data.y_train, data.train_offset))

    def rows(c):
      idx = jnp.minimum(jnp.take(offset, data.rows_of(c)) + width, last)
      return jnp.take(x_flat, idx, axis=0), jnp.take(y_flat, idx, axis=0)
  else:
    def rows(c):
      r = data.rows_of(c)
      return data.x_train[r], data.y_train[r]

  def one(cg):
    c, g = cg
    p = jax.tree.map(lambda a: a[g], parent_params)
    x, y = rows(c)
    loss, _, count = client_sums(model, p, x, y, jnp.take(jnp.asarray(data.n_train), c))[:3]
    return loss / jnp.maximum(count, 1.0)

  pairs = (candidates.clients, candidates.parent)
  if chunk_size is None or int(chunk_size) >= candidates.clients.shape[0]:
    return jax.vmap(one)(pairs)
  return jax.lax.map(one, pairs, batch_size=int(chunk_size))


class Strategy(NamedTuple):
  """A sampling strategy over a :class:`CohortSampler` (:func:`sampling_strategy`).

  Attributes:
    draw: ``draw(key, parent_params, time, data) -> Cohort``, the round's cohort (``data``: the round's
      data, whose rows a strategy that scores its candidates reads).
    reads: ``reads(key, parent_params, time) -> int32[D]``: every client whose data the draw and the
      round may read (the cohort, or power of choice's candidates), so that a streamed population
      holds their rows before the round.
    needs_state: whether ``reads`` depends on the round's own ``parent_params`` or ``time`` (then the
      clients of round ``t + 1`` are known only once round ``t`` has run).
  """

  draw: Callable
  reads: Callable
  needs_state: bool = False


def sampling_strategy(
  sampler: CohortSampler,
  sampling: str,
  *,
  data,
  model=None,
  candidates: int | None = None,
  online=None,
  chunk_size: int | None = None,
) -> Strategy:
  """The :class:`Strategy` of :data:`SAMPLING`'s ``sampling`` in ``sampler``'s layout (``"uniform"``
  draws ``sampler(key)`` itself, and so does ``"poisson"``: a :class:`PoissonSampler` draws its own
  cohorts).

  Args:
    sampler: the cohort's sampler (``k_g`` per parent).
    sampling: ``"uniform"``, ``"data_size"`` (:func:`weighted_cohort` by examples),
      ``"available"`` (uniform among ``online(time)``), ``"power_of_choice"`` (``candidates``
      per parent drawn by examples, default ``2 k_g`` at most the group; the ``k_g`` of highest
      :func:`candidate_losses` under ``parent_params`` kept).
    data: the federated data (examples per client).
    model: the model (power of choice).
    candidates: power-of-choice candidates per parent.
    online: ``online(time) -> bool[N]`` (``"available"``).
    chunk_size: power-of-choice candidates scored at once (:func:`candidate_losses`; ``None``:
      all; on ragged data the default is the sampler's ``chunk_size``, else all).

  Raises:
    ValueError: an unknown strategy, ``candidates`` without power of choice or fewer than a
      cohort, ``"available"`` without ``online``, a ``chunk_size`` < 1.
  """
  check_sampling(sampling)
  if candidates is not None and sampling != "power_of_choice":
    raise ValueError(f"candidates={candidates!r} is for sampling='power_of_choice', not {sampling!r}")
  if sampling in ("uniform", "poisson", "data_size", "available"):
    if sampling in ("uniform", "poisson"):
      def draw(key, parent_params, time, data_):
        return sampler(key)
    elif sampling == "data_size":
      n_train = data.n_train

      def draw(key, parent_params, time, data_):
        return weighted_cohort(sampler, key, n_train)
    else:
      if online is None:
        raise ValueError("sampling='available' needs systems= with an availability schedule")

      def draw(key, parent_params, time, data_):
        return weighted_cohort(sampler, key, online(time))
    return Strategy(draw, lambda key, parent_params, time: draw(key, parent_params, time, None).clients,
                    needs_state=sampling == "available")
  if chunk_size is not None and int(chunk_size) < 1:
    raise ValueError(f"chunk_size={chunk_size!r} must be >= 1 (candidates scored at once) or None")
  if chunk_size is None and data.ragged:
    chunk_size = sampler.chunk_size
  groups = np.bincount(np.asarray(sampler.parent), minlength=len(sampler.sizes))
  wanted = [2 * k for k in sampler.sizes] if candidates is None else [int(candidates)] * len(groups)
  if min(w - k for w, k in zip(wanted, sampler.sizes, strict=True)) < 0:
    raise ValueError(f"candidates={candidates!r} must be >= the cohort of every leaf parent "
                     f"({max(sampler.sizes)})")
  candidate_sampler = cohort_sampler(np.asarray(sampler.parent), np.minimum(wanted, groups), chunk_size=None)
  n_train = data.n_train

  def power_of_choice(key, parent_params, time, data_):
    cand = weighted_cohort(candidate_sampler, key, n_train)
    losses = candidate_losses(model, parent_params, cand, data_, chunk_size=chunk_size)
    return top_scores(sampler, cand, losses, jax.random.fold_in(key, 1))

  return Strategy(power_of_choice,
                  lambda key, parent_params, time: weighted_cohort(candidate_sampler, key, n_train).clients)
