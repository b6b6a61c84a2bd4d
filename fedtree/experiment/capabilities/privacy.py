"""The privacy capability: a run's ``privacy`` section, its update-path parts and its accounting.

The transforms are :mod:`fedtree.toolbox.privacy`'s, the accountant :mod:`fedtree.toolbox.accountant`;
:data:`CAPABILITY` turns a run's ``privacy`` section into the transforms (clipping at the clients,
noise at the chosen level) and reports the privacy spent after every round (``epsilon``), and a
sweep of target ε is calibrated to noise multipliers on the host. The unit is a client
(user-level DP): one round is one sampled Gaussian mechanism over each parent's clients,
composed over the rounds.

Section fields (``config.runs.<label>.privacy``)::

  clip_norm: C > 0 (with adaptive clipping: ignored, see adaptive.initial_clip)
  noise_multiplier: z >= 0  |  target_epsilon: ε > 0 (z calibrated before the run, printed; a
    sweep axis either way: a swept target is calibrated per setting on the host)
  delta: δ in (0, 1) (default 1e-5)
  mechanism: "central" (default) | "local"
  noise_level: the server level adding central noise (default -1: every clients' parent, e.g.
    every edge server; 0: the root only; negative levels count up from the clients' parents)
  per_layer: clip each leaf to C / sqrt(L) (default False)
  normalize: "count" (default with fixed-size cohorts; actual count, noise 2 z C) | "fixed"
    (expected cohort; the default, and the only choice, with Poisson sampling)
  adaptive: {initial_clip, target_quantile, learning_rate, count_noise} (Andrew et al. 2021)
  accountant: "rdp" (default) | "pld" (Poisson only)
  sampling: the run's (its ``sampling`` field: "uniform" -> "fixed", fixed-size cohorts,
    replace-one adjacency, RDP only; "poisson" with the run's ``poisson_q``, add/remove adjacency); a
    different value is refused, and so is a run sampling by data size, availability or loss
  adjacency: "replace_one" (default with fixed-size cohorts) | "add_remove" (default with Poisson
    sampling; with fixed-size cohorts only where every client takes part every round:
    ``cohort_size=None``)

**Which ε.** ε is user-level (the unit is a client's whole data) and depends on the neighbouring
relation. Fixed-size cohorts are accounted with replace-one adjacency (one client's data replaced
by another's: its clipped update can move the sum by ``2C``), the relation sampling without
replacement is analysed under (dp-accounting's ``SampledWithoutReplacementDpEvent`` takes no
other). Opacus, TensorFlow Privacy's DP-SGD and most papers report add/remove adjacency (one
client added or removed: ``C``) with Poisson sampling. At the same noise multiplier ``z`` (the
noise std over each relation's sensitivity: ``2 z C`` here, ``z C`` there) the replace-one ε is
about twice theirs: 10.0 against 4.99 for ``configs/privacy.py``'s ``eps10`` (``z = 1.548``,
``q = 0.2``, 40 rounds, δ = 1e-5; the add/remove figure is Poisson sampling's at the same ``q``
and ``z``). To compare with them, sample as they do (``sampling="poisson"``, ``poisson_q``: add/remove, noise
``z C``), or, where every client takes part every round (``cohort_size=None``: no sampling),
``adjacency="add_remove"`` (a Gaussian mechanism of sensitivity ``C``, ``normalize="fixed"``).
The final table says which relation its ε column uses, and the calibration message names it.

The run must use ``weighting="uniform"`` (refused otherwise, with the reason). The noise is
``z`` times the sensitivity of a node's sum under the accountant's adjacency: ``2 z C`` for the
fixed-size cohorts fedtree samples (replace-one), whatever the normalisation. With
``mechanism="local"`` every client adds that noise to its own clipped update; the ε reported is
the accounting of the aggregate (sampling-amplified), not each client's local guarantee.

**Where the noise is added** (``noise_level``), on a tree root -> edge servers -> clients:

* at every edge server (``-1``, hierarchical DP with untrusted edges): each edge ``e`` releases its
  noised sum, a sampled Gaussian mechanism over its own clients. A client is under one edge, so
  the round's ε is that of one edge (parallel composition; the edge with the largest sampling
  rate), and everything above the edges (their aggregation, any server optimizer, any period) is
  post-processing;
* at the root only (``0``; trusted edge servers), or any level ``l`` above the clients' parents.
  Sensitivity: with uniform weights, HierFAVG gives a child node the weight ``N_c`` (the clients
  under it, sampled or not: public) and with ``sgd(1.0)`` at a node and period 1 (every round the
  node starts from its parent's model) the node's model is ``Θ - Δ``, so the sum ``Σ_c N_c Δ_c``
  that level ``l`` aggregates is ``Σ_e N_e Δ_e`` over the edges below it, ``Δ_e`` the edge's clipped
  mean. One client of edge ``e`` moves ``Δ_e`` by at most ``2C / k_e`` (fixed-size cohorts of
  ``k_e``, replace-one) or ``C / (q N_e)`` (Poisson, fixed normalisation, add/remove), hence level
  ``l``'s sum by ``s C`` with ``s = 2 max_e N_e / k_e`` (fixed) or ``1 / q`` (Poisson). The noise
  added once at each node of level ``l`` is ``N(0, (z s C)^2)`` (``Plan.sensitivity``: ``s``).
  For every client the ratio of noise to its sensitivity is then at least ``z``, and the other
  edges' cohorts do not depend on it, so the accounting is the same sampled Gaussian with ``z`` and
  the largest rate as at the edges: one draw at the root costs the same ε, and its noise on the
  global model is ``sqrt(E)`` times smaller than that of ``E`` equal edges each adding its own.
  What this derivation does not bound is refused by name: a period > 1 at or below level ``l``
  (the edges train rounds on their own: one client steers the others' later updates), a server
  optimizer below ``l`` other than ``sgd(learning_rate=1.0)`` (momentum carries an update into
  later rounds), adaptive clipping (one clip norm per edge), local noise, and algorithms other than
  HierFAVG and the methods over it that keep its server (:func:`plain_upper_levels`). The edges' models
  themselves are not private in this mode: the edges are trusted.
"""

from __future__ import annotations

import difflib
import functools
import sys
from typing import Any, NamedTuple

import numpy as np

from fedtree.algorithms.host import hierfavg
from fedtree.experiment.capabilities import mobility
from fedtree.experiment.capability import Calibration, Capability, PathParts, RunContext, cohort_of, plain
from fedtree.experiment.fields import run_field
from fedtree.toolbox import privacy as dp
from fedtree.toolbox.accountant import (  # noqa: F401  (the accountant, as this section uses it)
  ACCOUNTANTS,
  ADJACENCIES,
  SAMPLINGS,
  calibrate,
  check_accountant,
  check_adjacency,
  check_delta,
  check_delta_population,
  check_sampling,
  default_adjacency,
  epsilon,
)

RUN_SAMPLINGS = {"uniform": "fixed", "poisson": "poisson"}
"""A run's ``sampling`` -> the accountant's: uniform fixed-size cohorts, or Poisson."""


MECHANISMS = ("central", "local")


FIELDS = ("clip_norm", "noise_multiplier", "target_epsilon", "delta", "mechanism", "noise_level",
          "per_layer", "normalize", "adaptive", "accountant", "sampling", "adjacency")


ADAPTIVE_FIELDS = ("initial_clip", "target_quantile", "learning_rate", "count_noise")


class Plan(NamedTuple):
  """A run's privacy section resolved against its run (what the converter and the runner's
  per-round ε need)."""

  noise_multiplier: Any
  clip_norm: Any
  delta: float
  mechanism: str
  noise_level: int
  per_layer: bool
  normalize: str
  adaptive: dp.Adaptive | None
  accountant: str
  sampling: str
  sampling_rate: float
  population: int
  cohort: int | None     # (fixed-size sampling: the cohort of the parent with the largest rate)
  expected: np.ndarray   # [P] expected cohort of every clients' parent
  depth: int = 1         # server levels of the tree (noise_level in 0 .. depth-1)
  sensitivity: float = 2.0       # noise above the clients' parents: the std is z C sensitivity
  node_weight: np.ndarray | None = None   # [N] clients under every node of noise_level
  adjacency: str = "replace_one"          # the neighbouring relation ε is accounted under


def _check_fields(section) -> None:
  for where, given, allowed in [("privacy", section, FIELDS),
                                ("privacy.adaptive", section.get("adaptive") or {}, ADAPTIVE_FIELDS)]:
    for f in given:
      if f not in allowed:
        close = difflib.get_close_matches(f, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{where}: unknown field {f!r}{hint}; allowed fields: {sorted(allowed)}")


STAGED = ("grouppfl",)
"""Algorithms whose stages run one update path on trees of different parents (GroupPerFL: every
client under one group, then under its data group). The expected cohort of a fixed normalisation
is per parent, so ``normalize="fixed"`` is refused for them; ε is accounted at the rate of the
stage that samples most (the data groups'), for every round: an upper bound."""

CLUSTERED = ("cfl", "ifca", "awcfl", "mcfl")
"""Algorithms whose parents are clusters: a cluster's expected cohort depends on which clients join
it in the round, so ``normalize="fixed"`` is refused for them (the counted one divides by the
members' noised count)."""


def plain_upper_levels(run: RunContext) -> bool:
  """Whether noise above the clients' parents has the sensitivity derived in the module docstring
  for ``run``'s algorithm: HierFAVG, or a method over it (declared with ``method_over``),
  whose upper levels are HierFAVG's. A method that keeps a server rule at the clients' parents
  (SCAFFOLD's control variates, FedDyn's ``h``, Mime's optimizer state) carries one client's
  update into later rounds: :func:`fedtree.algorithms.host.hierfavg.hierfavg` refuses noise above the
  parents with a server rule, whoever sets it."""
  factory = getattr(run, "factory", None)
  return factory is not None and (factory is hierfavg or getattr(factory, "host", None) is hierfavg)


def noise_level_of(level, depth: int) -> int:
  """``noise_level`` as a server level ``0 .. depth-1`` (negative: from the clients' parents)."""
  if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or not -depth <= int(level) < depth:
    raise ValueError(f"noise_level={level!r}; choose a server level of this {depth}-level tree: "
                     f"{list(range(depth))} or {list(range(-depth, 0))} (-1: the clients' parents)")
  return int(level) % depth


def _plain_sgd(server) -> bool:
  """Whether a server optimizer config is FedAvg's ``sgd(1.0)`` (None: the default, FedAvg)."""
  if server is None:
    return True
  cfg = dict(server.to_dict() if hasattr(server, "to_dict") else server)
  name = cfg.pop("name", None)
  lr = cfg.pop("learning_rate", 1.0)
  rest = {k: v for k, v in cfg.items() if v not in (None, 0, 0.0, False)}
  return name in ("fedavg", "sgd") and isinstance(lr, (int, float)) and float(lr) == 1.0 and not rest


def mechanism_level_checks(section, ctx: RunContext, level: int, depth: int) -> None:
  """Refuses, by name, noise above the clients' parents where its sensitivity is not the one
  derived in the module docstring: local noise, an algorithm other than HierFAVG's family
  (:func:`plain_upper_levels`), a server below the noising level that is not ``sgd(1.0)``, a
  period > 1 at or below it."""
  if level == depth - 1:
    return
  given = section.get("noise_level")
  mechanism = section.get("mechanism", "central")
  if mechanism != "central":
    raise ValueError(f"noise_level={given!r} with mechanism={mechanism!r}: local noise is added by the "
                     f"clients; a noise level above the clients' parents is for central noise")
  run = ctx.run
  if run is None:
    return
  algorithm = run.get("algorithm", None)
  if not plain_upper_levels(ctx):
    raise ValueError(f"noise_level={given!r} with algorithm={algorithm!r}: the sensitivity above the "
                     f"clients' parents is derived for HierFAVG and the methods over it that keep its "
                     f"server (hierfavg, fedprox, ditto, ...) only; use noise_level=-1")
  periods = run.get("periods", None)
  if periods is not None:
    periods = tuple(periods) if isinstance(periods, (list, tuple)) else (int(periods),) * (depth - 1)
    for lv in range(level, depth - 1):
      if lv < len(periods) and int(periods[lv]) != 1:
        raise ValueError(
          f"noise_level={given!r} with periods={periods!r}: level {lv} aggregates every {periods[lv]} "
          f"rounds, so the servers below it train {periods[lv]} rounds on their own and one client's "
          f"influence on what level {level} aggregates is unbounded (it steers the other clients' later "
          f"updates); use periods[{lv}]=1, or noise_level=-1 (noise at every edge server)")
  servers = run.get("servers", None)
  below = range(level + 1, depth)
  for lv in below:
    server = servers[lv] if servers is not None else run.get("server", None)
    if not _plain_sgd(server):
      raise ValueError(
        f"noise_level={given!r} with the server optimizer {plain(server)!r} at level {lv}: the "
        f"sensitivity at level {level} is derived for sgd(learning_rate=1.0) (FedAvg) at every level below "
        f"it (a momentum or adaptive server carries one client's update into later rounds); use "
        f"FedAvg servers below level {level}, or noise_level=-1")


def plan(section: dict, ctx: RunContext, *, verbose: bool = True) -> Plan:
  """The resolved section: checks every field, the run's weighting (its ``weighting`` field, else
  its factory's default), the cohort of the run's tree (sampling rate per parent: the largest
  counts) and calibrates ``z`` to ``target_epsilon`` (printed with ``verbose``). ``ctx``: the run
  (:func:`fedtree.experiment.registry.run_context`), or a shared context (its tree, no run)."""
  _check_fields(section)
  ctx = RunContext.of(ctx)
  run = ctx.run
  _check_weighting(run, ctx.params)
  mechanism, accountant, sampling = _sampling(section, run)
  delta = check_delta(section.get("delta", 1e-5))
  topology = getattr(ctx, "topology", None)
  num_clients = ctx.data.num_clients
  check_delta_population(delta, int(num_clients))
  depth = 1 if topology is None else topology.depth
  counts = (topology.leaf_counts(depth - 1) if topology is not None else np.asarray([num_clients]))
  q, population, cohort, expected = _rate(sampling, run, counts)
  rounds = int(run_field(ctx.config, run, "rounds"))
  adjacency = section.get("adjacency", default_adjacency(sampling))
  check_adjacency(adjacency, sampling, q if sampling == "poisson" else float(np.min(expected / counts)))
  level = noise_level_of(section.get("noise_level", -1), depth)
  mechanism_level_checks(section, ctx, level, depth)
  moving = mobility.membership_of(ctx)
  if moving is not None:   # every round one sampled Gaussian at each edge over its members of the round
    _check_moving(section, ctx, level, depth, adjacency, sampling)
    q, population, cohort = mobility.sampling_rate(moving, None if run is None else run.get("cohort_size"))
  # What one client can change of the noising node's delta_sum, in units of C (see the module
  # docstring): at the clients' parents 1 (or 2: central's counted normalisation); above them,
  # with uniform weights, sgd(1.0) and period 1 below, the node's sum is that of its leaf parents'
  # sums, each weighted N_e / n_e (clients under e / its expected cohort).
  adj = 2.0 if adjacency == "replace_one" else 1.0
  sensitivity = adj * float(np.max(counts / expected))
  node_weight = (topology.leaf_counts(level) if topology is not None else np.asarray([num_clients]))
  ad = section.get("adaptive") or None
  adaptive = None
  if ad:
    adaptive = dp.check_adaptive(dp.Adaptive(**{k: ad[k] for k in ADAPTIVE_FIELDS if k in ad}))
  z = _noise_multiplier(section, verbose=verbose, sampling_rate=q, rounds=rounds, delta=delta,
                        accountant=accountant, sampling=sampling, population=population, cohort=cohort,
                        adjacency=adjacency)
  clip_norm = section.get("clip_norm", None)
  if adaptive is None:
    if clip_norm is None:
      raise ValueError("privacy needs clip_norm (or adaptive: {initial_clip, ...})")
    dp.check_clip_norm(clip_norm)
  normalize = _normalization(section, run, adjacency=adjacency, sampling=sampling)
  if level != depth - 1 and adaptive is not None:
    raise ValueError(f"noise_level={section.get('noise_level')!r} with adaptive clipping: each edge server "
                     f"would adapt its own clip norm, and the noise above them needs one bound; use a "
                     f"fixed clip_norm or noise_level=-1")
  return Plan(z, clip_norm, delta, mechanism, level, bool(section.get("per_layer", False)), normalize,
              adaptive, accountant, sampling, q, population, cohort, expected, depth, sensitivity,
              node_weight.astype(np.float64), adjacency)


def _check_moving(section: dict, ctx, level: int, depth: int, adjacency: str, sampling: str) -> None:
  """Refuses what a moving membership's accounting does not bound, by name: noise above the edges
  (its sensitivity weighs every edge by its fixed clients), a fixed normalisation (an edge's expected
  cohort changes with its members), a membership that reads the clients' data."""
  if level != depth - 1:
    raise ValueError(f"noise_level={section.get('noise_level')!r} under a moving membership (mobility): "
                     f"the noise above the edges is calibrated on every edge's fixed clients; add it at the "
                     f"edges (noise_level=-1)")
  normalize = section.get("normalize", "count" if adjacency == "replace_one" else "fixed")
  if normalize == "fixed":
    raise ValueError("normalize='fixed' under a moving membership (mobility): an edge's expected cohort "
                     "changes with its members; use normalize='count'")
  reads = mobility.data_dependent(ctx)
  if reads is not None:
    raise ValueError(f"a moving membership whose {reads}: who shares an edge with whom would publish the "
                     f"clients' data beside the noised sums; associate by latency or load")


def _check_weighting(run, params) -> None:
  """Refuses a weighting of the clients' updates that privacy cannot bound: the run's ``weighting``
  field, else its factory's default (``params``)."""
  weighting = None
  if run is not None and "weighting" in run:
    weighting = run["weighting"]
  elif "weighting" in params:
    weighting = params["weighting"].default
  if weighting is not None:
    dp.check_private_weighting(weighting)


def _sampling(section: dict, run) -> tuple[str, str, str]:
  """``(mechanism, accountant, sampling)`` of the section, checked against each other and against
  the run's own sampling of its cohort."""
  mechanism = section.get("mechanism", "central")
  if mechanism not in MECHANISMS:
    raise ValueError(f"mechanism={mechanism!r}; choose one of {list(MECHANISMS)}")
  accountant = section.get("accountant", "rdp")
  run_sampling = "uniform" if run is None else run.get("sampling", "uniform")
  if run_sampling not in RUN_SAMPLINGS:
    raise ValueError(f"the run's sampling={run_sampling!r}: differential privacy is accounted for "
                     f"{sorted(RUN_SAMPLINGS)} only (a cohort chosen by data size, availability or loss "
                     f"depends on the clients' data: no sampling amplification is known for it)")
  sampling = section.get("sampling", RUN_SAMPLINGS[run_sampling])
  if sampling not in SAMPLINGS:
    raise ValueError(f"sampling={sampling!r}; choose one of {list(SAMPLINGS)}")
  if sampling != RUN_SAMPLINGS[run_sampling]:
    raise ValueError(f"sampling={sampling!r} but the run samples with sampling={run_sampling!r}; the "
                     f"accounting must match the run's sampling (set the run's sampling and poisson_q)")
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant={accountant!r}; choose one of {list(ACCOUNTANTS)}")
  check_accountant(accountant, sampling)
  if sampling == "poisson" and run is not None and run.get("systems", None) is not None:
    raise ValueError("sampling='poisson' with a systems section: its round policy (dropout, a deadline, "
                     "availability) changes who takes part, which the Poisson accounting does not model; "
                     "run without the systems section or with sampling='uniform'")
  return mechanism, accountant, sampling


def _rate(sampling: str, run, counts: np.ndarray) -> tuple[float, int, int | None, np.ndarray]:
  """``(q, population, cohort, expected)``: the sampling rate accounted for, the population and
  cohort it is the rate of (the parent that samples most; ``None``: Poisson), and the expected
  cohort ``float[P]`` of every clients' parent (``counts``: its clients)."""
  if sampling == "poisson":
    q = float(run.get("poisson_q"))
    check_sampling(sampling, q)
    return q, int(counts.max()), None, q * counts
  expected = cohort_of(None if run is None else run.get("cohort_size", None), counts)
  rates = expected / counts
  i = int(np.argmax(rates))
  return float(rates[i]), int(counts[i]), int(expected[i]), expected


def _noise_multiplier(section: dict, *, verbose: bool, **accounting) -> float:
  """The section's ``noise_multiplier``, or the one :func:`calibrate` finds for its
  ``target_epsilon`` under ``accounting`` (printed with ``verbose``); exactly one of them given."""
  if ("noise_multiplier" in section) == ("target_epsilon" in section):
    raise ValueError("give exactly one of noise_multiplier and target_epsilon")
  if "target_epsilon" not in section:
    z = section["noise_multiplier"]
    dp.check_noise_multiplier(z)
    return z
  z = calibrate(target_epsilon=section["target_epsilon"], **accounting)
  if verbose:
    a = accounting
    print(f"privacy: noise_multiplier z={z:.4f} calibrated to target_epsilon={section['target_epsilon']} "
          f"at delta={a['delta']:g} over {a['rounds']} rounds (q={a['sampling_rate']:.4g}, "
          f"{a['accountant']}, {a['adjacency'].replace('_', '-')} adjacency)", file=sys.stderr, flush=True)
  return z


def _normalization(section: dict, run, *, adjacency: str, sampling: str) -> str:
  """The section's ``normalize`` (default: ``"count"`` under replace-one adjacency, else
  ``"fixed"``), refused where its sensitivity is unbounded (a fixed one across GroupPerFL's
  stages, a count under Poisson sampling or add/remove adjacency)."""
  normalize = section.get("normalize", "count" if adjacency == "replace_one" else "fixed")
  if normalize not in dp.NORMALIZATIONS:
    raise ValueError(f"normalize={normalize!r}; choose one of {list(dp.NORMALIZATIONS)}")
  algorithm = None if run is None else run.get("algorithm", None)
  if normalize == "fixed" and algorithm in STAGED:
    raise ValueError(f"normalize='fixed' with algorithm={algorithm!r}: its stages aggregate the same clients "
                     f"under different parents (one group, then the data groups), and a fixed normalisation "
                     f"needs one expected cohort per parent; use normalize='count'")
  if normalize == "fixed" and algorithm in CLUSTERED:
    raise ValueError(f"normalize='fixed' with algorithm={algorithm!r}: its parents are clusters, and a "
                     f"cluster's expected cohort depends on which clients join it in the round; use "
                     f"normalize='count'")
  if sampling == "poisson" and normalize == "count":
    raise ValueError("normalize='count' with sampling='poisson': the actual count of a Poisson cohort is "
                     "private and dividing by it has no bounded sensitivity; use normalize='fixed'")
  if adjacency == "add_remove" and normalize == "count":
    raise ValueError("normalize='count' with adjacency='add_remove': the count is the one thing an added or "
                     "removed client changes, and dividing by it has no bounded sensitivity; use "
                     "normalize='fixed'")
  return normalize


def transforms(p: Plan) -> dict[int, dict[str, tuple]]:
  """The update-path parts of a resolved plan ``{level: fields of a PathParts}``: the clients'
  parents (``-1``) clip (and normalise); the noise at them, or at ``p.noise_level`` above them."""
  name = "dp"
  adaptive_node = name if p.adaptive is not None else None
  replace_one = p.adjacency == "replace_one"
  z = dp.delta_noise_multiplier(p.noise_multiplier, p.adaptive, replace_one=replace_one)
  # the noise is z times the sensitivity under the accountant's adjacency: fixed-size cohorts are
  # accounted with replace-one (a client's clipped update moves by up to 2C); a counted
  # normalisation's noise is 2zC already
  scale = 2.0 if replace_one and p.normalize == "fixed" else 1.0
  client = [dp.clip(p.clip_norm, per_layer=p.per_layer, adaptive_node=adaptive_node)]
  if p.mechanism == "local":
    client.append(dp.local_noise(z * (2.0 if replace_one else 1.0), p.clip_norm,
                                 adaptive_node=adaptive_node))
  above = p.noise_level != p.depth - 1
  if (p.mechanism == "local" or above) and p.adaptive is None and p.normalize == "count":
    leaf = {"client": tuple(client)}   # nothing for the parents to do (the plain mean divides by the count)
  else:
    node = dp.central(z, p.clip_norm, normalize=p.normalize, expected_weight=p.expected.astype(np.float32),
                      adaptive=p.adaptive, add_noise=p.mechanism == "central" and not above,
                      sensitivity_scale=scale, name=name)
    leaf = {"client": tuple(client), "node": (node,)}
  if not above:
    return {-1: leaf}
  top = dp.central(z, p.clip_norm, normalize="fixed", expected_weight=p.node_weight.astype(np.float32),
                   sensitivity_scale=p.sensitivity, name=name)
  return {-1: leaf, p.noise_level: {"node": (top,)}}


def epsilon_after(p: Plan, rounds: int) -> float:
  """ε at the plan's δ after ``rounds`` rounds (the runner's per-round metric)."""
  return epsilon(noise_multiplier=float(p.noise_multiplier), sampling_rate=p.sampling_rate, rounds=rounds,
                 delta=p.delta, accountant=p.accountant, sampling=p.sampling, population=p.population,
                 cohort=p.cohort, adjacency=p.adjacency)


def parts(section, ctx) -> dict[int, PathParts]:
  """The ``privacy`` section's update-path parts ``{level: PathParts}`` (:func:`transforms` of its
  :func:`plan`)."""
  return {lv: PathParts(**p) for lv, p in transforms(plan(dict(plain(section)), ctx)).items()}


def round_metrics(section, ctx):
  """The run's privacy spent: ``r -> {"epsilon": ε after r rounds}`` (at the section's δ;
  user-level), or ``None`` without a section. A noise multiplier that is not a number here (a
  sweep axis) is the sweep's to account (:data:`CAPABILITY`'s calibration)."""
  section = plain(section)
  if not section:
    return None
  p = plan(dict(section), ctx, verbose=False)   # (the build checked the weighting)

  @functools.cache
  def metrics(r: int) -> dict[str, float]:
    return {"epsilon": epsilon_after(p, int(r))}

  return metrics


def calibrated_noise(section, ctx) -> float:
  """The noise multiplier a section with a ``target_epsilon`` is calibrated to (:func:`plan`)."""
  return float(plan(dict(plain(section)), ctx, verbose=False).noise_multiplier)


CAPABILITY = Capability(
  name="privacy", about="differential privacy: clipping, noise, accounting", parts=parts,
  round_metrics=round_metrics,
  calibration=Calibration(swept="target_epsilon", traced="noise_multiplier", value=calibrated_noise,
                          what="noise multipliers", symbol="z"),
)
"""The ``privacy`` section (see the module docstring)."""
