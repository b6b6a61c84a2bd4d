"""The secure-aggregation capability: a run's ``secure`` section, SecAgg's numerics at any server
level of its tree (:mod:`fedtree.toolbox.secagg`) and, at the clients' parents, distributed
differential privacy with its accounting (:mod:`fedtree.toolbox.distributed_dp`).

Section fields (``config.runs.<label>.secure``)::

  mechanism: "none" (default: SecAgg's numerics only) | "ddg" (distributed discrete Gaussian) |
    "skellam"
  bits: the field's bits b, modulus 2^b (default 32 with "none", 20 with a DP mechanism)
  levels: the server levels whose children sum securely (default -1: every clients' parent; 0: the
    root among its children; a list for several); a DP mechanism runs at -1 only
  threshold: the fraction of a parent's cohort (and, with neighbours, of a client's shareholders)
    that must survive for its sum to be recovered (default 0.5); below it the round fails there
  neighbours: SecAgg+'s neighbourhood k (an even integer); absent: SecAgg (every client shares
    with all)
  # mechanism "none":
  clip_range: every coordinate of w Δ clipped to [-r, r] (default 8.0, Flower's)
  quant_bits: a coordinate's signed bits q <= min(b, 24) (default 22: Flower's 2^22 levels)
  rounding: "stochastic" (default) | "deterministic"
  # mechanism "ddg" | "skellam":
  clip_norm: every client's L2 clip norm c
  noise_multiplier: z (the survivors' noise adds up to std 2 z c, z times a client's replace-one
    sensitivity) | target_epsilon: ε (z calibrated before the run, printed)
  delta: δ (default 1e-5)
  k_stddevs: the standard deviations of a coordinate of the sum the field holds (default 4)
  beta: the conditional rounding's failure probability per try (default exp(-0.5))

The unit of DP is a client, its parent's cohort fixed-size (the run's ``sampling="uniform"``:
replace-one adjacency, sampling without replacement): every clients' parent releases one noised
sum a round (each client is under one parent: parallel composition, the parent with the largest
sampling rate decides), and everything above it is post-processing, on a tree of any depth. The
noise of each client is calibrated so that the threshold's survivors add up to the central noise:
a round that fails releases nothing. ``epsilon`` is reported after every round.

Refused, by name, with the reason: a robust (blockwise) aggregator or an omniscient attack at a
secure level (they read individual updates, SecAgg reveals their sum), an algorithm outside
HierFAVG's family (its server rule, clustering or asynchrony reads or buffers what SecAgg hides),
a DP mechanism with example weights, Poisson cohorts, a ``privacy`` section, or above the clients'
parents.
"""

from __future__ import annotations

import difflib
import functools
import math
import sys
from typing import Any, NamedTuple

import jax
import numpy as np

from fedtree.algorithms.host import hierfavg
from fedtree.experiment.capability import Capability, PathParts, RunContext, plain
from fedtree.experiment.fields import run_field
from fedtree.toolbox import distributed_dp as ddp
from fedtree.toolbox import privacy as dp
from fedtree.toolbox import secagg

MECHANISMS = ("none",) + ddp.MECHANISMS

COMMON = ("mechanism", "bits", "levels", "threshold", "neighbours")
NUMERICS = ("clip_range", "quant_bits", "rounding")
PRIVATE = ("clip_norm", "noise_multiplier", "target_epsilon", "delta", "k_stddevs", "beta")
FIELDS = COMMON + NUMERICS + PRIVATE

DEFAULT_BITS = {"none": 32, "ddg": 20, "skellam": 20}


class Plan(NamedTuple):
  """A run's ``secure`` section resolved against its run."""

  mechanism: str
  bits: int
  levels: tuple[int, ...]          # server levels 0 .. depth-1
  threshold: float
  neighbours: int | None
  depth: int
  leaf_cohort: np.ndarray | None   # [P] the clients' parents' cohorts (None: Poisson, unknown)
  leaf_expected: np.ndarray        # [P] their expected cohorts (for the bytes)
  fixed_point: dict                # clip_range, quant_bits, rounding (mechanism "none")
  mechanisms: tuple = ()           # [P] distributed_dp.Mechanism of every clients' parent
  rates: tuple = ()                # [P] their clients' sampling rates
  delta: float = 1e-5


def _check_fields(section) -> None:
  for f in section:
    if f not in FIELDS:
      close = difflib.get_close_matches(f, FIELDS, n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      raise ValueError(f"unknown field {f!r}{hint}; allowed fields: {sorted(FIELDS)}")


def _levels(value, depth: int) -> tuple[int, ...]:
  items = value if isinstance(value, (list, tuple)) else [value]
  out = []
  for lv in items:
    if isinstance(lv, bool) or not isinstance(lv, (int, np.integer)) or not -depth <= int(lv) < depth:
      raise ValueError(f"levels={value!r}: choose server levels of this {depth}-level tree: "
                       f"{list(range(depth))} or {list(range(-depth, 0))} (-1: the clients' parents)")
    out.append(int(lv) % depth)
  if not out:
    raise ValueError("levels=[] names no level; give -1 (the clients' parents) or a list of levels")
  return tuple(sorted(set(out)))


def _model_dim(ctx) -> int:
  """The model's parameter count (what a client's update flattens to; an upper bound of what it
  sends where some leaves stay personal)."""
  shapes = jax.eval_shape(ctx.model.init, jax.random.key(0))
  return int(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)))


def plan(section: dict, ctx, *, verbose: bool = True) -> Plan:
  """The resolved section: every field checked, the run's weighting and sampling, the cohorts of
  its tree, the mechanism of every clients' parent (``z`` calibrated to ``target_epsilon``,
  printed with ``verbose``)."""
  _check_fields(section)
  ctx = RunContext.of(ctx)
  run = ctx.run
  mechanism = section.get("mechanism", "none")
  if mechanism not in MECHANISMS:
    raise ValueError(f"mechanism={mechanism!r}; choose one of {list(MECHANISMS)}")
  private = mechanism != "none"
  wrong = [f for f in section if f in (NUMERICS if private else PRIVATE)]
  if wrong:
    kind = (f"mechanism={mechanism!r} scales, rotates and rounds the update itself" if private
            else "mechanism='none' adds no noise")
    raise ValueError(f"{wrong} do not apply: {kind}; its fields are "
                     f"{sorted(COMMON + (PRIVATE if private else NUMERICS))}")
  bits = section.get("bits", DEFAULT_BITS[mechanism])
  if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not (
      2 <= int(bits) <= secagg.MAX_BITS):
    raise ValueError(f"bits={bits!r} must be an integer in [2, {secagg.MAX_BITS}] (the field is the integers "
                     f"modulo 2^bits)")
  bits = int(bits)
  threshold = section.get("threshold", 0.5)
  neighbours = section.get("neighbours", None)
  secagg.check_protocol(threshold, neighbours)
  topology = ctx.topology
  depth = 1 if topology is None else int(topology.depth)
  levels = _levels(section.get("levels", -1), depth)
  counts = (np.asarray([ctx.data.num_clients]) if topology is None
            else np.asarray(topology.leaf_counts(depth - 1), np.int64))
  sampling = "uniform" if run is None else run.get("sampling", "uniform")
  if sampling == "poisson":
    cohort = None
    expected = np.ceil(float(run.get("poisson_q")) * counts)
  else:
    cohort = ctx.cohort if run is not None else counts.copy()
    expected = np.asarray(cohort, np.float64)
  fixed = {}
  if not private:
    defaults = (("clip_range", 8.0), ("quant_bits", 22), ("rounding", "stochastic"))
    fixed = {k: section.get(k, d) for k, d in defaults}
    secagg.check_fixed_point(bits, **fixed)
    return Plan(mechanism, bits, levels, float(threshold), neighbours, depth, cohort, expected, fixed)
  # distributed DP
  if levels != (depth - 1,):
    raise ValueError(f"levels={section.get('levels')!r} with mechanism={mechanism!r}: the clients add the "
                     f"distributed noise, so it runs where they sum, at the clients' parents (levels=-1); "
                     f"the levels above aggregate the parents' noised sums (post-processing)")
  if run is not None and run.get("privacy", None):
    raise ValueError(f"mechanism={mechanism!r} with a 'privacy' section: two DP mechanisms on one update; "
                     f"distributed DP clips, noises and accounts by itself (drop the privacy section, or use "
                     f"mechanism='none' for SecAgg's numerics under central DP)")
  weighting = None
  if run is not None and "weighting" in run:
    weighting = run["weighting"]
  elif "weighting" in ctx.params:
    weighting = ctx.params["weighting"].default
  if weighting is not None:
    dp.check_private_weighting(weighting)
  if sampling != "uniform":
    raise ValueError(f"mechanism={mechanism!r} with the run's sampling={sampling!r}: distributed DP is "
                     f"accounted for fixed-size cohorts (sampling='uniform', replace-one adjacency); with "
                     f"Poisson cohorts the clients' summed noise, and whether a parent's round fails, depend "
                     f"on how many were drawn")
  delta = ddp_delta = section.get("delta", 1e-5)
  from fedtree.toolbox.accountant import check_delta, check_delta_population

  check_delta(ddp_delta)
  check_delta_population(float(delta), int(ctx.data.num_clients))
  clip = section.get("clip_norm", None)
  if clip is None:
    raise ValueError(f"mechanism={mechanism!r} needs clip_norm (every client's L2 clip norm)")
  dp.check_clip_norm(clip)
  if not math.isfinite(float(clip)):
    raise ValueError(f"clip_norm={clip!r}: distributed DP needs a finite clip norm (the sensitivity)")
  k_std = float(section.get("k_stddevs", 4.0))
  beta = float(section.get("beta", ddp.DEFAULT_BETA))
  survivors = np.maximum(np.ceil(float(threshold) * np.asarray(cohort, np.float64)), 1).astype(np.int64)
  parents = [ddp.Parent(int(n), int(k), int(t)) for n, k, t in zip(counts, cohort, survivors, strict=True)]
  dim = secagg._pow2(_model_dim(ctx))
  rounds = int(run_field(ctx.config, run, "rounds")) if run is not None else 1
  if ("noise_multiplier" in section) == ("target_epsilon" in section):
    raise ValueError(f"mechanism={mechanism!r}: give exactly one of noise_multiplier and target_epsilon")
  common = dict(bits=bits, clip=float(clip), dim=dim, k_stddevs=k_std, beta=beta)
  if "target_epsilon" in section:
    z = ddp.calibrate(mechanism, parents, target_epsilon=section["target_epsilon"], rounds=rounds,
                      delta=float(delta), **common)
    if verbose:
      print(f"secure: noise_multiplier z={z:.4f} calibrated to target_epsilon={section['target_epsilon']} at "
            f"delta={float(delta):g} over {rounds} rounds ({mechanism}, {bits} bits, replace-one adjacency)",
            file=sys.stderr, flush=True)
  else:
    z = section["noise_multiplier"]
    dp.check_noise_multiplier(z)
    if not float(z) > 0:
      raise ValueError(f"noise_multiplier={z!r}: a DP mechanism needs z > 0 (mechanism='none' adds no noise)")
  mechs = tuple(ddp.mechanism(mechanism, noise_multiplier=float(z), cohort=p.cohort, survivors=p.survivors,
                              **common) for p in parents)
  rates = tuple(p.cohort / p.population for p in parents)
  return Plan(mechanism, bits, levels, float(threshold), neighbours, depth, cohort, expected, {}, mechs,
              rates, float(delta))


def _children(topology, level: int) -> np.ndarray:
  parent = np.asarray(topology.parent(level + 1))
  return np.bincount(parent, minlength=topology.num_nodes(level)).astype(np.int64)


def transforms(p: Plan, ctx) -> dict[int, PathParts]:
  """The update-path parts of a resolved plan ``{level: PathParts}``: at every secure level the
  encoding (the last client transform), the secure sum in place of the level's mean (a blockwise
  aggregator refused), the recovery and the protocol's download."""
  out = {}
  topology = RunContext.of(ctx).topology
  for lv in p.levels:
    leaf = lv == p.depth - 1
    if leaf:
      cohort, size = p.leaf_cohort, p.leaf_expected
    else:
      cohort = None
      size = _children(topology, lv).astype(np.float64)
    if p.mechanism == "none":
      encoding = secagg.fixed_point(bits=p.bits, **p.fixed_point)
    else:
      encoding = secagg.distributed(p.mechanisms)
    up, down = secagg.exchange_bytes(size, p.neighbours)
    n = np.asarray(size, np.float64)
    k = np.maximum(n - 1, 0) if p.neighbours is None else np.minimum(p.neighbours, np.maximum(n - 1, 0))
    t = np.ceil(p.threshold * (k + 1))
    agg = secagg.secure_sum(encoding)

    def wrap(aggregator, agg=agg):
      secagg.check_aggregator(aggregator, what="secure aggregation (the 'secure' section)")
      return agg

    out[-1 if leaf else lv] = PathParts(
      client=(secagg.client(encoding, exchange_up=up, masks=k + 1, share_ops=2 * k * t),),
      node=(secagg.recovery(cohort=cohort, threshold=p.threshold, neighbours=p.neighbours),),
      wrap_aggregator=(wrap,),
      wrap_down=(lambda d, down=down: secagg.with_exchange(d, down),),
    )
  return out


def parts(section, ctx) -> dict[int, PathParts]:
  """The ``secure`` section's update-path parts (:func:`transforms` of its :func:`plan`)."""
  return transforms(plan(dict(plain(section)), ctx), ctx)


def round_metrics(section, ctx):
  """``r -> {"epsilon": ε after r rounds}`` of a DP mechanism (at the section's δ), else ``None``."""
  section = plain(section)
  if not section or section.get("mechanism", "none") == "none":
    return None
  p = plan(dict(section), ctx, verbose=False)
  pairs = tuple(zip(p.mechanisms, p.rates, strict=True))

  @functools.cache
  def metrics(r: int) -> dict[str, float]:
    return {"epsilon": ddp.epsilon(pairs, rounds=int(r), delta=p.delta)}

  return metrics


def hint(path, section) -> Any:
  """Every field of the section is a constant of the compiled program (the field, the grid, the
  samplers' parameters, computed on the host): none is a sweep axis (sweep them as runs)."""
  return int


def takes(spec) -> bool:
  """Whether algorithm ``spec`` takes the section: HierFAVG and the methods over it (their factory's
  ``host``), whose clients' updates reach their parents through the update path (what a server rule
  reads beside them, such as SCAFFOLD's control variates, is summed in the clear: docs/secure.md)."""
  return spec.factory is hierfavg or getattr(spec.factory, "host", None) is hierfavg


CAPABILITY = Capability(
  name="secure", about="secure aggregation (modular sums of encoded updates) and distributed DP",
  parts=parts, round_metrics=round_metrics, hint=hint,
  algorithms=takes,
)
"""The ``secure`` section (see the module docstring)."""
