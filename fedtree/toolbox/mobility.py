"""Trees that move: mobility models, edge failures and client-edge association policies, each
building a :class:`~fedtree.core.membership.Membership` on the host (numpy, seeded) before anything
compiles.

* **Traces** (:func:`from_trace`, :func:`read_trace`): rows ``(client, round, edge)`` (or a simulated
  time for the round), each putting the client on the edge from that round on.
* **Mobility models**: :func:`markov`, a Markov chain over the edges (a client stays a geometric
  number of rounds of mean ``dwell``, then moves to another edge, uniformly or by a transition
  matrix); :func:`random_waypoint`, clients moving in the unit square at a speed towards random
  waypoints (Johnson and Maltz 1996), associated every round by a policy over their distance to
  the edges.
* **Association policies** (:data:`POLICIES`), each a function of a latency matrix ``[C, E]``:
  ``"nearest"`` (the edge of least latency), ``"balanced"`` (the least latency under a capacity of
  ``ceil(C / live edges)`` clients per edge: load balancing) and ``"label_mix"`` (each edge's label
  mix as close as it can to the population's: a greedy assignment minimizing the sum over edges of the
  squared distance of its label counts from the global mix's, under the same capacity: the
  data-distribution-aware association).
* **Edge failures** (:func:`fail_edges`): every up edge fails with probability ``rate`` a round and
  is repaired ``repair`` rounds later (or a trace of outages); its clients wait (``"wait"``) or
  re-associate to the live edge nearest their own (``"reassociate"``).

Example:
  >>> m = markov(np.array([0, 0, 1, 1]), num_edges=2, num_rounds=50, dwell=5.0, seed=0)
  >>> m.edges.shape, bool(m.handovers.sum() > 0)
  ((50, 4), True)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence

import numpy as np

from fedtree.core.membership import Membership

POLICIES = ("nearest", "balanced", "label_mix")
"""The association policies (:func:`associate`)."""

RULES = ("wait", "reassociate")
"""What the clients of a down edge do (:func:`fail_edges`)."""


def grid_positions(num_edges: int) -> np.ndarray:
  """``float[E, 2]``: ``num_edges`` edges at the centres of the cells of a near-square grid of the unit
  square, row by row.

  Example:
    >>> grid_positions(4).tolist()
    [[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]]
  """
  e = int(num_edges)
  cols = math.ceil(math.sqrt(e))
  rows = math.ceil(e / cols)
  i = np.arange(e)
  return np.stack([(i % cols + 0.5) / cols, (i // cols + 0.5) / rows], axis=1)


def distances(clients: np.ndarray, edges: np.ndarray) -> np.ndarray:
  """``float[C, E]``: the Euclidean distance of every client to every edge (a latency matrix)."""
  return np.linalg.norm(np.asarray(clients)[:, None, :] - np.asarray(edges)[None, :, :], axis=-1)


def _live(live, num_edges: int) -> np.ndarray:
  live = np.ones(num_edges, bool) if live is None else np.asarray(live, bool)
  if not live.any():
    raise ValueError("no edge is up: a client has nowhere to associate")
  return live


def _capacity(num_clients: int, live: np.ndarray, capacity) -> int:
  cap = math.ceil(num_clients / int(live.sum())) if capacity is None else int(capacity)
  if cap * int(live.sum()) < num_clients:
    raise ValueError(f"capacity={cap} clients per edge over {int(live.sum())} live edges holds fewer than "
                     f"the {num_clients} clients")
  return cap


def nearest(latency: np.ndarray, live=None) -> np.ndarray:
  """``int[C]``: every client on the live edge of least latency (the lowest index on ties)."""
  latency = np.asarray(latency, np.float64)
  live = _live(live, latency.shape[1])
  return np.argmin(np.where(live[None, :], latency, np.inf), axis=1)


def balanced(latency: np.ndarray, live=None, capacity: int | None = None) -> np.ndarray:
  """``int[C]``: the least latency under a capacity per live edge (default ``ceil(C / live edges)``):
  the (client, edge) pairs in order of latency, each taken when the client has no edge yet and the
  edge has room (greedy load balancing)."""
  latency = np.asarray(latency, np.float64)
  n, e = latency.shape
  live = _live(live, e)
  cap = _capacity(n, live, capacity)
  out = np.full(n, -1, np.int64)
  load = np.zeros(e, np.int64)
  for flat in np.argsort(np.where(live[None, :], latency, np.inf), axis=None, kind="stable"):
    c, g = divmod(int(flat), e)
    if out[c] < 0 and live[g] and load[g] < cap:
      out[c], load[g] = g, load[g] + 1
  return out


def deviation(counts: np.ndarray, global_mix: np.ndarray) -> np.ndarray:
  """``||counts - n g||^2`` per row: how far an edge's label counts (``n`` examples) are from the counts
  its examples would have under the population's mix ``g`` (0 for an empty edge)."""
  counts = np.asarray(counts, np.float64)
  return np.sum((counts - counts.sum(-1, keepdims=True) * global_mix) ** 2, axis=-1)


def label_mix(label_counts: np.ndarray, latency: np.ndarray, live=None, capacity: int | None = None, *,
              seed: int = 0) -> np.ndarray:
  """``int[C]``: each edge's label mix as close as it can to the population's. The clients in a seeded
  random order, each to the live edge with room where it adds least to the sum over edges of
  :func:`deviation` (the squared distance of an edge's label counts from those of the global mix at its
  size: a client goes where its labels are short), ties broken by ``latency``, then the lowest index;
  capacity as :func:`balanced` (greedy: a heuristic for an assignment problem NP-hard in general).

  Args:
    label_counts: ``[C, L]`` every client's examples of every label.
    latency: ``[C, E]`` (its shape names the edges).
  """
  counts = np.asarray(label_counts, np.float64)
  lat = np.asarray(latency, np.float64)
  n, num_labels = counts.shape
  e = lat.shape[1]
  live = _live(live, e)
  cap = _capacity(n, live, capacity)
  global_mix = counts.sum(0) / max(counts.sum(), 1.0)
  edge_counts = np.zeros((e, num_labels))
  load = np.zeros(e, np.int64)
  out = np.full(n, -1, np.int64)
  for c in np.random.default_rng(seed).permutation(n):
    change = deviation(edge_counts + counts[c][None, :], global_mix) - deviation(edge_counts, global_mix)
    ok = live & (load < cap)
    order = np.lexsort((np.arange(e), lat[c], np.where(ok, change, np.inf)))
    g = int(order[0])
    out[c], load[g] = g, load[g] + 1
    edge_counts[g] += counts[c]
  return out


def associate(policy: str, latency: np.ndarray, *, live=None, label_counts=None,
              seed: int = 0) -> np.ndarray:
  """``int[C]`` every client's edge by ``policy`` (:data:`POLICIES`) over ``latency`` ``[C, E]``."""
  if policy == "nearest":
    return nearest(latency, live)
  if policy == "balanced":
    return balanced(latency, live)
  if policy == "label_mix":
    if label_counts is None:
      raise ValueError("association 'label_mix' needs every client's label counts")
    return label_mix(label_counts, latency, live, seed=seed)
  raise ValueError(f"association policy {policy!r}; choose one of {POLICIES}")


def _check_initial(initial, num_edges: int) -> np.ndarray:
  initial = np.asarray(initial, np.int64)
  if initial.ndim != 1 or initial.size == 0:
    raise ValueError(f"the clients' initial edges must be int[clients], got shape {initial.shape}")
  bad = np.flatnonzero((initial < 0) | (initial >= num_edges))
  if bad.size:
    raise ValueError(f"client {int(bad[0])} starts on edge {int(initial[bad[0]])}, outside [0, {num_edges})")
  return initial


def _check_rounds(num_rounds) -> int:
  if int(num_rounds) < 1:
    raise ValueError(f"num_rounds={num_rounds} must be >= 1")
  return int(num_rounds)


def from_trace(rows, *, initial, num_edges: int, num_rounds: int) -> Membership:
  """The membership of a handover trace: ``rows`` ``int[M, 3]`` of ``(client, round, edge)``, each
  putting ``client`` on ``edge`` from ``round`` (1-based) on; before its first row a client is on its
  ``initial`` edge (``int[C]``: the tree's). Rows of one client apply in round order (the last of a
  round wins).

  Raises:
    ValueError: a row naming an unknown client, an edge past the tree, or a round outside
      ``1 .. num_rounds`` (the row's index and values named).
  """
  initial = _check_initial(initial, int(num_edges))
  num_rounds = _check_rounds(num_rounds)
  rows = np.asarray(rows, np.int64).reshape(-1, 3)
  n = initial.size
  for i, (c, r, g) in enumerate(rows):
    if not 0 <= c < n:
      raise ValueError(f"trace row {i}: client {int(c)} is not a client of the run (ids 0..{n - 1})")
    if not 0 <= g < num_edges:
      raise ValueError(f"trace row {i}: edge {int(g)} is past the tree's edges (0..{int(num_edges) - 1})")
    if not 1 <= r <= num_rounds:
      raise ValueError(f"trace row {i}: round {int(r)} is outside the run's rounds 1..{num_rounds}")
  edges = np.repeat(initial[None, :], num_rounds, axis=0)
  for i in np.lexsort((np.arange(len(rows)), rows[:, 1])):   # by round, in file order within one
    c, r, g = (int(v) for v in rows[i])
    edges[r - 1:, c] = g
  return Membership(edges=edges, up=np.ones((num_rounds, int(num_edges)), bool))


def read_trace(path: str, *, seconds_per_round: float | None = None) -> np.ndarray:
  """``int[M, 3]`` rows ``(client, round, edge)`` of a CSV file with a header naming ``client``,
  ``edge`` and either ``round`` (1-based) or ``time`` (simulated seconds; round ``floor(time /
  seconds_per_round) + 1``)."""
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f)
    fields = set(reader.fieldnames or ())
    when = "round" if "round" in fields else "time" if "time" in fields else None
    if not {"client", "edge"} <= fields or when is None:
      raise ValueError(f"{path}: a handover trace needs the columns client, edge and round (or time); got "
                       f"{sorted(fields)}")
    if when == "time" and not seconds_per_round:
      raise ValueError(f"{path}: a trace in simulated time needs seconds_per_round (> 0) to find its rounds")
    out = []
    for i, line in enumerate(reader):
      try:
        c, g, t = int(line["client"]), int(line["edge"]), float(line[when])
      except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: row {i + 1} is not numbers ({dict(line)}): {e}") from e
      r = int(t) if when == "round" else int(math.floor(t / float(seconds_per_round or 1.0))) + 1
      out.append((c, r, g))
  return np.asarray(out, np.int64).reshape(-1, 3)


def markov(initial, *, num_edges: int, num_rounds: int, dwell: float, seed: int,
           transition: np.ndarray | None = None) -> Membership:
  """A Markov chain over the edges: in every round after the first a client leaves its edge with
  probability ``1 / dwell`` (a geometric dwell time of mean ``dwell`` rounds), to another edge drawn
  uniformly, or by its edge's row of ``transition`` (``[E, E]``; the diagonal is ignored).

  Raises:
    ValueError: ``dwell`` below one round (zero included: a client would have to leave every edge
      before arriving), a transition matrix of another shape or a row with nowhere to go.
  """
  initial = _check_initial(initial, int(num_edges))
  num_rounds, e = _check_rounds(num_rounds), int(num_edges)
  if not float(dwell) >= 1.0:
    raise ValueError(f"dwell={dwell!r} must be >= 1 round (the mean rounds a client stays on an edge; "
                     f"float('inf') for clients that never move)")
  if e < 2:
    raise ValueError(f"a Markov chain over {e} edge has nowhere to move; the tree needs >= 2 edges")
  if transition is None:
    moves = np.ones((e, e)) - np.eye(e)
  else:
    moves = np.asarray(transition, np.float64) * (1 - np.eye(e))
    if moves.shape != (e, e) or (moves < 0).any():
      raise ValueError(f"transition must be a non-negative [{e}, {e}] matrix, got shape {moves.shape}")
    empty = np.flatnonzero(moves.sum(1) <= 0)
    if empty.size:
      raise ValueError(f"transition row {int(empty[0])} has no mass off its diagonal: edge {int(empty[0])}'s "
                       f"clients have nowhere to move")
  cdf = np.cumsum(moves / moves.sum(1, keepdims=True), axis=1)
  rng = np.random.default_rng(seed)
  edges = np.empty((num_rounds, initial.size), np.int64)
  edges[0] = initial
  leave = 1.0 / float(dwell)
  for r in range(1, num_rounds):
    cur = edges[r - 1]
    go = rng.random(cur.size) < leave
    u = rng.random(cur.size)
    dest = np.minimum((u[:, None] > cdf[cur]).sum(1), e - 1)
    edges[r] = np.where(go, dest, cur)
  return Membership(edges=edges, up=np.ones((num_rounds, e), bool))


def random_waypoint(start: np.ndarray, edge_positions: np.ndarray, *, num_rounds: int, speed: float,
                    seed: int, pause: int = 0, policy: str = "nearest",
                    label_counts=None) -> tuple[Membership, np.ndarray]:
  """Random waypoint mobility (Johnson and Maltz 1996) in the unit square: every client heads for a
  uniform waypoint at ``speed`` (units a round), rests ``pause`` rounds on arrival and heads for the
  next; every round the clients are associated by ``policy`` (:func:`associate`) over their distance
  to ``edge_positions``. Returns the membership and the clients' positions ``float[R, C, 2]``.

  Args:
    start: ``float[C, 2]`` the clients' positions in round 1.
    speed: the distance a moving client covers a round (> 0; 0.05 crosses the square in 20 rounds).
  """
  num_rounds = _check_rounds(num_rounds)
  if not float(speed) > 0:
    raise ValueError(f"speed={speed!r} must be > 0 (units of the unit square a round); a static membership "
                     f"is model='static'")
  if int(pause) < 0:
    raise ValueError(f"pause={pause!r} must be >= 0 rounds")
  rng = np.random.default_rng(seed)
  pos = np.clip(np.asarray(start, np.float64), 0.0, 1.0)
  n = pos.shape[0]
  target = rng.random((n, 2))
  rest = np.zeros(n, np.int64)
  positions = np.empty((num_rounds, n, 2))
  edges = np.empty((num_rounds, n), np.int64)
  for r in range(num_rounds):
    positions[r] = pos
    edges[r] = associate(policy, distances(pos, edge_positions), label_counts=label_counts, seed=seed + r)
    gap = target - pos
    dist = np.linalg.norm(gap, axis=1)
    moving = rest == 0
    arrive = moving & (dist <= speed)
    step = np.where(dist[:, None] > 0, gap / np.maximum(dist, 1e-12)[:, None] * float(speed), 0.0)
    pos = np.where((moving & ~arrive)[:, None], pos + step, np.where(arrive[:, None], target, pos))
    rest = np.where(arrive, int(pause), np.maximum(rest - 1, 0))
    fresh = arrive if int(pause) == 0 else (rest == 0) & ~moving
    target = np.where(fresh[:, None], rng.random((n, 2)), target)
  return Membership(edges=edges, up=np.ones((num_rounds, len(edge_positions)), bool)), positions


def outages(num_edges: int, num_rounds: int, *, rate: float, repair: int, seed: int) -> np.ndarray:
  """``bool[R, E]`` the edges up every round: an edge up in a round fails with probability ``rate`` in the
  next (from round 2) and is down ``repair`` rounds, then up again (at least one round)."""
  if not 0.0 <= float(rate) < 1.0:
    raise ValueError(f"rate={rate!r} must be in [0, 1) (an edge's probability of failing a round)")
  if int(repair) < 1:
    raise ValueError(f"repair={repair!r} must be >= 1 round (how long a failed edge stays down)")
  rng = np.random.default_rng(seed)
  up = np.ones((int(num_rounds), int(num_edges)), bool)
  left = np.zeros(int(num_edges), np.int64)
  for r in range(1, int(num_rounds)):
    fail = up[r - 1] & (rng.random(int(num_edges)) < float(rate))   # (a repaired edge is up a round first)
    left = np.where(fail, int(repair), left)
    up[r] = left == 0
    left = np.maximum(left - 1, 0)
  return up


def outage_trace(rows: Sequence[Sequence[int]], num_edges: int, num_rounds: int) -> np.ndarray:
  """``bool[R, E]`` from rows ``(edge, first round down, last round down)`` (1-based, inclusive)."""
  up = np.ones((int(num_rounds), int(num_edges)), bool)
  for i, row in enumerate(rows):
    g, a, b = (int(v) for v in row)
    if not 0 <= g < num_edges:
      raise ValueError(f"outage row {i}: edge {g} is past the tree's edges (0..{int(num_edges) - 1})")
    if not 1 <= a <= b <= num_rounds:
      raise ValueError(f"outage row {i}: rounds {a}..{b} are not within 1..{int(num_rounds)} in order")
    up[a - 1:b, g] = False
  return up


def fail_edges(membership: Membership, up: np.ndarray, *, rule: str = "wait",
               edge_positions: np.ndarray | None = None) -> Membership:
  """``membership`` with the edges ``up`` (``bool[R, E]``, :func:`outages` or :func:`outage_trace`):
  under ``"wait"`` a down edge's clients stay its members and take no part; under ``"reassociate"``
  they move, for the rounds it is down, to the live edge nearest theirs (by ``edge_positions``; the
  lowest index without positions), and back when it is up. A static membership is repeated over
  ``up``'s rounds."""
  if rule not in RULES:
    raise ValueError(f"rule={rule!r}; choose one of {RULES}")
  up = np.asarray(up, bool)
  num_rounds, e = up.shape
  if e != membership.num_edges:
    raise ValueError(f"outages of {e} edges for a membership of {membership.num_edges}")
  edges = membership.edges
  if edges.shape[0] < num_rounds:
    edges = np.concatenate([edges, np.repeat(edges[-1:], num_rounds - edges.shape[0], axis=0)])
  if up.shape[0] < edges.shape[0]:
    up = np.concatenate([up, np.repeat(up[-1:], edges.shape[0] - up.shape[0], axis=0)])
  edges = edges.copy()
  if rule == "reassociate":
    gap = (np.zeros((e, e)) if edge_positions is None else distances(edge_positions, edge_positions))
    for r in range(edges.shape[0]):
      if up[r].all() or not up[r].any():
        continue
      order = np.lexsort((np.broadcast_to(np.arange(e), (e, e)), np.where(up[r][None, :], gap, np.inf)))
      moved = ~up[r][edges[r]]
      edges[r, moved] = order[edges[r, moved], 0]
  return Membership(edges=edges, up=up)
