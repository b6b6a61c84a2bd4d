"""Simulated latencies and buffered asynchronous aggregation inside the vectorized program, as B-HFL
(paper 001) asks for every node of a tree, in the style of FedBuff (Nguyen et al. 2022).

The latencies (:class:`Latency`) and the first arrivals of every node (:func:`segment_rank`,
:func:`first_arrivals`): :doc:`asynchrony on the B-HFL page <algorithms/bhfl.md#asynchrony>`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

LATENCY_KINDS = ("none", "constant", "exponential", "lognormal", "uniform")


@dataclasses.dataclass(frozen=True)
class Latency:
  """A distribution of delays, in rounds.

  * ``none``: 0 (synchronous);
  * ``constant``: ``mean``;
  * ``exponential``: mean ``mean``;
  * ``lognormal``: ``exp(N(log(mean) - σ²/2, σ²))``, so its mean is ``mean`` **(choice)**;
  * ``uniform``: ``U[low, high)``.

  ``scale`` multiplies every delay of node ``i`` by ``scale[i]`` when given (slow subtrees).
  """

  kind: str = "none"
  mean: float = 0.5
  sigma: float = 1.0
  low: float = 0.0
  high: float = 1.0
  scale: tuple[float, ...] | None = None

  def __post_init__(self):
    if self.kind not in LATENCY_KINDS:
      raise ValueError(f"latency kind={self.kind!r}; choose one of {LATENCY_KINDS}")
    if self.mean < 0 or self.sigma < 0:
      raise ValueError(f"latency mean={self.mean} and sigma={self.sigma} must be >= 0")
    if not 0 <= self.low <= self.high:
      raise ValueError(f"latency needs 0 <= low={self.low} <= high={self.high}")
    if self.scale is not None and min(self.scale) < 0:
      raise ValueError(f"latency scale={self.scale} must be >= 0")

  @property
  def is_zero(self) -> bool:
    return self.kind == "none" or (self.kind == "constant" and self.mean == 0)

  def sample(self, key: jax.Array, num: int) -> jax.Array:
    """``float32[num]`` delays."""
    if self.kind == "none":
      d = jnp.zeros((num,), jnp.float32)
    elif self.kind == "constant":
      d = jnp.full((num,), self.mean, jnp.float32)
    elif self.kind == "exponential":
      d = self.mean * jax.random.exponential(key, (num,), jnp.float32)
    elif self.kind == "lognormal":
      z = jax.random.normal(key, (num,), jnp.float32)
      d = jnp.exp(np.log(max(self.mean, 1e-30)) - 0.5 * self.sigma**2 + self.sigma * z)
    else:
      d = jax.random.uniform(key, (num,), jnp.float32, self.low, self.high)
    if self.scale is not None:
      if len(self.scale) != num:
        raise ValueError(f"latency scale has {len(self.scale)} entries for {num} nodes")
      d = d * jnp.asarray(self.scale, jnp.float32)
    return d


def latency_from_config(cfg) -> Latency:
  """A :class:`Latency` from ``None``, a kind name, a dict or a ConfigDict."""
  if cfg is None:
    return Latency()
  if isinstance(cfg, str):
    return Latency(kind=cfg)
  if isinstance(cfg, Latency):
    return cfg
  kw = dict(cfg.items() if hasattr(cfg, "items") else cfg)
  if kw.get("scale") is not None:
    kw["scale"] = tuple(float(s) for s in kw["scale"])
  return Latency(**kw)


def segment_starts(segment: np.ndarray, num_segments: int) -> np.ndarray:
  """Static start offset of every segment once rows are sorted by segment."""
  counts = np.bincount(np.asarray(segment), minlength=num_segments)
  return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)


def segment_rank(sort_key: jax.Array, eligible: jax.Array, segment: np.ndarray,
                 num_segments: int) -> jax.Array:
  """Rank of every row among the eligible rows of its segment, by ``sort_key`` then index.

  Ineligible rows rank after every eligible row of their segment. ``segment`` is static
  (numpy ``int[N]``).
  """
  n = sort_key.shape[0]
  seg = jnp.asarray(segment, jnp.int32)
  key = jnp.where(eligible, sort_key, jnp.inf)
  order = jnp.lexsort((jnp.arange(n), key, seg))      # last key is the primary one
  starts = jnp.asarray(segment_starts(segment, num_segments))
  pos = jnp.arange(n, dtype=jnp.int32) - starts[seg[order]]
  return jnp.zeros((n,), jnp.int32).at[order].set(pos)


def first_arrivals(arrival: jax.Array, eligible: jax.Array, segment: np.ndarray,
                   num_segments: int, buffer_size: int | None) -> jax.Array:
  """``bool[N]``: the first ``buffer_size`` eligible arrivals of every segment (all if ``None``)."""
  if buffer_size is None:
    return eligible
  return eligible & (segment_rank(arrival, eligible, segment, num_segments) < buffer_size)


def latency_from_systems(systems, num_steps, model_bytes: float, *, seconds_per_round: float) -> Latency:
  """The clients' :class:`Latency` (B-HFL's level ``depth``) from a device population
  (:class:`fedtree.toolbox.systems.Systems`): every client's download, ``num_steps[c]`` local steps
  and upload, in simulated seconds (:meth:`~fedtree.toolbox.systems.Systems.client_seconds`),
  over ``seconds_per_round`` seconds per B-HFL round. A constant delay per client, scaled by
  its device (the same profiles as the simulated clock of HierFAVG and FedBuff).

  Raises:
    ValueError: ``seconds_per_round`` not > 0.
  """
  if not float(seconds_per_round) > 0:
    raise ValueError(f"seconds_per_round={seconds_per_round!r} must be > 0")
  clients = jnp.arange(systems.profile.num_clients, dtype=jnp.int32)
  seconds = systems.client_seconds(clients, jnp.asarray(num_steps, jnp.float32), model_bytes)
  return Latency(kind="constant", mean=1.0,
                 scale=tuple(float(s) / float(seconds_per_round) for s in np.asarray(seconds)))
