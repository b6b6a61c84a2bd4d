"""The mobility capability: a run's ``mobility`` section -> a :class:`fedtree.core.membership.Membership`
(the clients' edges round by round, and the edges up), the argument of every algorithm whose factory
takes ``membership`` (HierFAVG and the methods over it; the registry refuses the section elsewhere,
naming the algorithms that take it, and the host refuses a server rule that does not move, a systems
model or another sampling than uniform by name). A privacy section adds its noise at the edges and is
accounted at the largest rate the membership samples (:func:`sampling_rate`); noise above them, a
fixed normalisation and a ``label_mix`` association (which reads the clients' labels) are refused.

The section (every field optional)::

  mobility = {
    "model": "static",         # static | markov | waypoint | trace: how clients move between edges
    "association": "tree",     # tree (the config's) | nearest | balanced | label_mix: the clients'
                               # edges in round 1 (static, markov, trace) or every round (waypoint)
    "placement": "tree",       # tree: clients start near their tree edge; uniform: anywhere
    "spread": 0.1,             # the standard deviation of a client's start around its tree edge
    "dwell": 10.0,             # markov: the mean rounds a client stays on an edge (>= 1)
    "speed": 0.05, "pause": 0, # waypoint: the distance a client covers a round, its rest at a waypoint
    "trace": "handovers.csv",  # trace: client, round (or time), edge: a client's edge from then on
    "seconds_per_round": None, # trace: the simulated seconds of a round (a trace in time)
    "latency": None,           # a .npy [clients, edges] latency matrix for the association (default:
                               # the distance of every client to every edge, edges on a grid)
    "failures": {"rate": 0.05, "repair": 3, "rule": "wait"},   # or {"trace": "outages.csv", ...}
                               # (edge, first, last: rounds down); rule wait | reassociate
    "seed": None,              # default: the config's seed
  }

Edges sit on a grid of the unit square (:func:`fedtree.toolbox.mobility.grid_positions`); the rows
report ``handovers``, ``edges_down`` and ``edge_clients_max`` (in the round) and ``edge<e>_down`` for
every edge that fails in the run.
"""

from __future__ import annotations

import io
import json
from typing import Any

import jax
import numpy as np

from fedtree.core.membership import Membership
from fedtree.experiment.capability import Capability, plain
from fedtree.experiment.fields import field
from fedtree.experiment.spec import check_fields
from fedtree.toolbox import mobility as mob

FIELDS = ("model", "association", "placement", "spread", "dwell", "speed", "pause", "trace",
          "seconds_per_round", "latency", "failures", "seed")
MODELS = ("static", "markov", "waypoint", "trace")
ASSOCIATIONS = ("tree",) + mob.POLICIES
PLACEMENTS = ("tree", "uniform")
FAILURE_FIELDS = ("rate", "repair", "rule", "trace")
MODEL_FIELDS = {"static": (), "markov": ("dwell",), "waypoint": ("speed", "pause"),
                "trace": ("trace", "seconds_per_round")}


def _concrete(cfg: dict, where: str = "mobility") -> None:
  for k, v in cfg.items():
    if isinstance(v, dict):
      _concrete(v, f"{where}.{k}")
    elif isinstance(v, jax.core.Tracer):
      raise ValueError(f"{where}.{k} cannot be swept in one program: the membership is built on the host "
                       f"before the round compiles; give each value its own run")


def label_counts(data) -> np.ndarray:
  """``int[C, L]`` every client's training examples of every label (padded or ragged rows)."""
  rows = np.nonzero(data.real_rows("train"))
  owner = data.client_of_row("train", rows)
  y = np.asarray(data.y_train)[rows].astype(np.int64)
  out = np.zeros((data.num_clients, int(y.max()) + 1 if y.size else 1), np.int64)
  np.add.at(out, (owner, y), 1)
  return out


def _check(cfg: dict) -> tuple[str, str, str]:
  check_fields("mobility", cfg, FIELDS)
  _concrete(cfg)
  model = cfg.get("model", "static")
  if model not in MODELS:
    raise ValueError(f"mobility.model={model!r}; choose one of {MODELS}")
  stray = sorted(f for m, fs in MODEL_FIELDS.items() if m != model for f in fs if f in cfg)
  if stray:
    raise ValueError(f"mobility.{stray[0]} is read by another model than model={model!r}: "
                     f"{ {m: list(fs) for m, fs in MODEL_FIELDS.items() if fs} }")
  association = cfg.get("association", "nearest" if model == "waypoint" else "tree")
  if association not in ASSOCIATIONS:
    raise ValueError(f"mobility.association={association!r}; choose one of {ASSOCIATIONS}")
  if model == "waypoint" and association == "tree":
    raise ValueError(f"mobility.association='tree' with model='waypoint': a moving client's edge is chosen "
                     f"every round by a policy; choose one of {mob.POLICIES}")
  placement = cfg.get("placement", "tree")
  if placement not in PLACEMENTS:
    raise ValueError(f"mobility.placement={placement!r}; choose one of {PLACEMENTS}")
  if model == "trace" and "trace" not in cfg:
    raise ValueError("mobility.model='trace' needs mobility.trace, the path of a CSV of client, round (or "
                     "time), edge")
  return model, association, placement


_MADE: dict[tuple, Membership] = {}
"""The memberships made lately (a run's section is read for its argument, its rows and its files)."""


def membership_from_config(section, ctx) -> Membership:
  """The :class:`~fedtree.core.membership.Membership` of a run's ``mobility`` section (the module)."""
  cfg = {k: plain(v) for k, v in dict(plain(section)).items()}
  checked = _check(cfg)
  reads = label_counts(ctx.data).tobytes() if cfg.get("association") == "label_mix" else b""
  key = (json.dumps(cfg, sort_keys=True, default=str), ctx.topology, int(field(ctx.config, "rounds")),
         int(field(ctx.config, "seed")), reads, ctx.run is not None and "secure" in ctx.run)
  if key not in _MADE:
    if len(_MADE) >= 8:
      _MADE.pop(next(iter(_MADE)))
    _MADE[key] = _membership(cfg, ctx, *checked)
  return _MADE[key]


def _membership(cfg: dict, ctx, model: str, association: str, placement: str) -> Membership:
  if ctx.run is not None and "secure" in ctx.run:
    raise ValueError("a secure section under a moving membership: secure aggregation's groups are every "
                     "edge's fixed clients; run it on a fixed tree")
  topo = ctx.topology
  if topo is None:
    raise ValueError("a mobility section needs a run on a tree (its clients' parents are the edges)")
  leaf = topo.depth - 1
  num_edges, n = topo.num_nodes(leaf), topo.num_clients
  rounds = int(field(ctx.config, "rounds"))
  seed = int(cfg.get("seed", field(ctx.config, "seed")))
  rng = np.random.default_rng(seed)
  tree = np.asarray(topo.parent(topo.depth), np.int64)
  edge_pos = mob.grid_positions(num_edges)
  spread = float(cfg.get("spread", 0.1))
  if not spread >= 0:
    raise ValueError(f"mobility.spread={spread!r} must be >= 0")
  start = (edge_pos[tree] + rng.normal(0.0, spread, (n, 2)) if placement == "tree" else rng.random((n, 2)))
  start = np.clip(start, 0.0, 1.0)
  labels = label_counts(ctx.data) if association == "label_mix" else None
  if model == "waypoint":
    membership, _ = mob.random_waypoint(start, edge_pos, num_rounds=rounds,
                                        speed=float(cfg.get("speed", 0.05)), seed=seed,
                                        pause=int(cfg.get("pause", 0)), policy=association,
                                        label_counts=labels)
  else:
    initial = tree
    if association != "tree":
      latency = mob.distances(start, edge_pos) if cfg.get("latency") is None else _latency(cfg["latency"], n,
                                                                                            num_edges)
      initial = mob.associate(association, latency, label_counts=labels, seed=seed)
    if model == "static":
      membership = Membership.static(initial, num_edges)
    elif model == "markov":
      membership = mob.markov(initial, num_edges=num_edges, num_rounds=rounds,
                              dwell=float(cfg.get("dwell", 10.0)), seed=seed)
    else:
      rows = mob.read_trace(str(cfg["trace"]), seconds_per_round=cfg.get("seconds_per_round"))
      membership = mob.from_trace(rows, initial=initial, num_edges=num_edges, num_rounds=rounds)
  failures = cfg.get("failures")
  if failures:
    membership = _failures(dict(failures), membership, num_edges, rounds, seed, edge_pos)
  return membership


def _latency(path: str, n: int, num_edges: int) -> np.ndarray:
  lat = np.load(str(path))
  if lat.shape != (n, num_edges):
    raise ValueError(f"mobility.latency {path!r} has shape {lat.shape}; the run needs [{n}, {num_edges}] "
                     f"(clients, edges)")
  return lat


def _failures(cfg: dict, membership: Membership, num_edges: int, rounds: int, seed: int,
              edge_pos) -> Membership:
  check_fields("mobility.failures", cfg, FAILURE_FIELDS)
  rule = cfg.get("rule", "wait")
  if rule not in mob.RULES:
    raise ValueError(f"mobility.failures.rule={rule!r}; choose one of {mob.RULES}")
  if "trace" in cfg:
    clash = [f for f in ("rate", "repair") if f in cfg]
    if clash:
      raise ValueError(f"mobility.failures: trace replaces {clash}; give one or the other")
    rows = np.loadtxt(str(cfg["trace"]), delimiter=",", skiprows=1, ndmin=2, dtype=np.int64)
    up = mob.outage_trace(rows, num_edges, rounds)
  else:
    if "rate" not in cfg:
      raise ValueError("mobility.failures needs rate (an edge's probability of failing a round) and repair "
                       "(rounds down), or trace")
    up = mob.outages(num_edges, rounds, rate=float(cfg["rate"]), repair=int(cfg.get("repair", 1)),
                     seed=seed + 1)
  return mob.fail_edges(membership, up, rule=rule, edge_positions=edge_pos)


def membership_of(ctx) -> Membership | None:
  """The membership run ``ctx``'s ``mobility`` section makes (``None``: it has none)."""
  run = getattr(ctx, "run", None)
  if run is None or "mobility" not in run:
    return None
  capabilities = getattr(ctx, "capabilities", None)
  if capabilities is not None and "mobility" not in capabilities:
    return None
  return membership_from_config(run["mobility"], ctx)


def data_dependent(ctx) -> str | None:
  """What makes run ``ctx``'s membership depend on the clients' data (its ``label_mix`` association
  reads their labels), or ``None``: it is public (traces, mobility models, latency, failures)."""
  section = plain(dict(plain(ctx.run["mobility"]))) if getattr(ctx, "run", None) is not None and (
    "mobility" in ctx.run) else {}
  if section.get("association") == "label_mix":
    return "association='label_mix' (it reads the clients' labels)"
  return None


def sampling_rate(membership: Membership, cohort_size) -> tuple[float, int, int]:
  """``(q, population, cohort)``: the largest rate at which a client is sampled in any round under
  ``membership`` (``cohort_size`` of its edge's live members, ``None``: all of them), and the edge's
  members and cohort at it (an upper bound on every round's: a sampled Gaussian's privacy loss grows
  with its rate)."""
  loads = membership.loads
  live = (loads > 0) & membership.up
  if not live.any():
    return 1.0, 1, 1
  n = loads[live].astype(np.int64)
  k = n if cohort_size is None or int(cohort_size) == -1 else np.minimum(int(cohort_size), n)
  rates = k / n
  i = int(np.argmax(rates))
  return float(rates[i]), int(n[i]), int(k[i])


def round_metrics(section, ctx):
  """``r -> {edge<e>_down: 0 or 1}`` for every edge that fails in the run (none: ``None``)."""
  failures = plain(dict(plain(section)).get("failures"))
  if not failures:
    return None
  membership = membership_from_config(section, ctx)
  down = np.flatnonzero(~membership.up.all(axis=0))
  if not down.size:
    return None

  def metrics(r: int) -> dict[str, Any]:
    row = membership.up[min(max(int(r), 1), membership.num_rounds) - 1]
    return {f"edge{int(g)}_down": int(not row[g]) for g in down}

  return metrics


def files(section, ctx) -> dict[str, bytes]:
  """``membership_<run>.npz``: the membership the run follows (``edges`` ``int32[R, C]``, ``up``
  ``bool[R, E]``), drawn as ``plot_membership_<run>.png`` by
  :func:`fedtree.experiment.plots.write_run_plots`."""
  membership = membership_from_config(section, ctx)
  buf = io.BytesIO()
  np.savez_compressed(buf, edges=membership.edges, up=membership.up)
  return {f"membership_{ctx.label}.npz": buf.getvalue()}


CAPABILITY = Capability(name="mobility", about="clients moving between edges, edge failures, association",
                        argument="membership", value=membership_from_config, round_metrics=round_metrics,
                        files=files)
"""The ``mobility`` section (see the module docstring)."""
