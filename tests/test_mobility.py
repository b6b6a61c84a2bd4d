"""A tree that moves (issue 54): memberships built by traces, mobility models, failures and association
policies; the host under a moving membership against a plain per-round loop; a membership that never
moves is the run without one, bit for bit; what cannot move is refused by name."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from helpers import ALGORITHM_CASES, count_traces, small_context, trees_equal
from reference_baselines import close, np64, run_jit, sgd_client, small_problem, start, train_key

from fedtree.algorithms.host.hierfavg import hierfavg
from fedtree.core.local import LocalSchedule
from fedtree.core.membership import Membership, MobileSampler, mobile_sampler
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.experiment import registry
from fedtree.toolbox import mobility as mob
from fedtree.toolbox.robust import median

LR, B, STEPS = 0.1, 4, 2


# ------------------------------------------------------------------ memberships on the host
def test_a_trace_puts_each_client_on_its_edge_from_its_round_on(tmp_path):
  m = mob.from_trace([(0, 2, 1), (1, 3, 0), (0, 4, 0)], initial=[0, 1, 1], num_edges=2, num_rounds=4)
  assert m.edges.tolist() == [[0, 1, 1], [1, 1, 1], [1, 0, 1], [0, 0, 1]]
  assert m.handovers.tolist() == [0, 1, 1, 1] and m.up.all()
  path = tmp_path / "t.csv"
  path.write_text("client,time,edge\n0,15.0,1\n1,29.9,0\n")
  rows = mob.read_trace(str(path), seconds_per_round=10.0)
  assert rows.tolist() == [[0, 2, 1], [1, 3, 0]]
  with pytest.raises(ValueError, match="needs seconds_per_round"):
    mob.read_trace(str(path))


@pytest.mark.parametrize("row, message", [
  ((7, 2, 1), r"trace row 0: client 7 is not a client of the run \(ids 0..2\)"),
  ((0, 2, 5), r"trace row 0: edge 5 is past the tree's edges \(0..1\)"),
  ((0, 9, 1), r"trace row 0: round 9 is outside the run's rounds 1..4"),
])
def test_a_trace_naming_what_the_run_lacks_is_refused(row, message):
  with pytest.raises(ValueError, match=message):
    mob.from_trace([row], initial=[0, 1, 1], num_edges=2, num_rounds=4)


@pytest.mark.parametrize("dwell", [0.0, 0.5, -3.0])
def test_a_dwell_below_one_round_is_refused(dwell):
  with pytest.raises(ValueError, match=rf"dwell={dwell!r} must be >= 1 round"):
    mob.markov([0, 1], num_edges=2, num_rounds=3, dwell=dwell, seed=0)


def test_markov_clients_stay_a_geometric_time_of_mean_dwell_and_move_uniformly():
  n, rounds, e, dwell = 2000, 40, 4, 4.0
  m = mob.markov(np.arange(n) % e, num_edges=e, num_rounds=rounds, dwell=dwell, seed=3)
  moved = m.edges[1:] != m.edges[:-1]
  trials, p = moved.size, 1 / dwell
  assert abs(moved.mean() - p) < 5 * np.sqrt(p * (1 - p) / trials)   # (5 sigma of the sample)
  # a move goes to each of the other three edges with probability 1/3
  src, dst = m.edges[:-1][moved], m.edges[1:][moved]
  step = (dst - src) % e
  for s in (1, 2, 3):
    frac = np.mean(step == s)
    assert abs(frac - 1 / 3) < 5 * np.sqrt(2 / 9 / step.size)
  assert not (step == 0).any()


def test_random_waypoint_moves_at_its_speed_and_associates_to_the_nearest_edge():
  rng = np.random.default_rng(0)
  edges = mob.grid_positions(4)
  m, pos = mob.random_waypoint(rng.random((30, 2)), edges, num_rounds=25, speed=0.07, seed=1, pause=2)
  step = np.linalg.norm(pos[1:] - pos[:-1], axis=-1)
  assert step.max() <= 0.07 + 1e-12 and (step == 0).any() and (np.abs(step - 0.07) < 1e-9).any()
  for r in (0, 10, 24):
    assert m.edges[r].tolist() == np.argmin(mob.distances(pos[r], edges), axis=1).tolist()
  with pytest.raises(ValueError, match="speed=0.0 must be > 0"):
    mob.random_waypoint(pos[0], edges, num_rounds=2, speed=0.0, seed=0)


def test_association_policies():
  rng = np.random.default_rng(1)
  n, e = 24, 4
  lat = mob.distances(rng.random((n, 2)), mob.grid_positions(e))
  assert mob.nearest(lat).tolist() == np.argmin(lat, axis=1).tolist()
  live = np.array([True, False, True, True])
  assert 1 not in mob.nearest(lat, live)
  bal = mob.balanced(lat)
  assert np.bincount(bal, minlength=e).max() == n // e
  assert np.bincount(mob.balanced(lat, live), minlength=e).tolist()[1] == 0
  # label_mix: 16 clients of one label each, 4 of every label; every edge ends with the global mix
  n, lat = 16, lat[:16]
  counts = np.zeros((n, 4), np.int64)
  counts[np.arange(n), np.arange(n) % 4] = 10
  mix = mob.label_mix(counts, lat)
  per_edge = np.stack([counts[mix == g].sum(0) for g in range(e)])
  assert (per_edge == per_edge[0]).all()
  near = mob.nearest(lat)

  def divergence(assign):
    g = counts.sum(0) / counts.sum()
    out = 0.0
    for edge in range(e):
      c = counts[assign == edge].sum(0)
      if c.sum():
        p = c / c.sum()
        out += float(np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1) / g), 0)))
    return out

  assert divergence(mix) < 1e-12 < divergence(near)
  with pytest.raises(ValueError, match="association policy 'closest'; choose one of"):
    mob.associate("closest", lat)


def test_outages_last_their_repair_time_and_come_at_their_rate():
  up = mob.outages(50, 400, rate=0.05, repair=3, seed=0)
  assert up[0].all()
  starts = 0
  for g in range(50):
    down = ~up[:, g]
    edges = np.flatnonzero(np.diff(np.concatenate([[0], down.astype(int), [0]])))
    for a, b in zip(edges[::2], edges[1::2], strict=True):
      assert b - a == 3 or b == 400   # (cut by the end of the run)
      starts += 1
  # an up edge fails with p = 0.05 a round: the up rounds that could fail, and the failures
  trials = int(up[:-1].sum())
  assert abs(starts / trials - 0.05) < 5 * np.sqrt(0.05 * 0.95 / trials)
  assert mob.outages(5, 10, rate=0.0, repair=1, seed=0).all()
  with pytest.raises(ValueError, match="repair=0 must be >= 1 round"):
    mob.outages(5, 10, rate=0.1, repair=0, seed=0)


def test_a_down_edges_clients_wait_or_move_to_the_nearest_live_edge():
  m = Membership.static([0, 0, 1, 2, 3], 4)
  up = mob.outage_trace([(0, 2, 3)], 4, 4)
  wait = mob.fail_edges(m, up, rule="wait")
  assert (wait.edges == [0, 0, 1, 2, 3]).all() and wait.up[:, 0].tolist() == [True, False, False, True]
  pos = np.array([[0.0, 0.0], [0.9, 0.0], [0.0, 0.2], [0.5, 0.5]])
  moved = mob.fail_edges(m, up, rule="reassociate", edge_positions=pos)
  assert moved.edges[:, :2].tolist() == [[0, 0], [2, 2], [2, 2], [0, 0]]   # edge 2 is nearest edge 0
  assert moved.handovers.tolist() == [0, 2, 0, 2]
  with pytest.raises(ValueError, match=r"outage row 0: edge 4 is past the tree's edges \(0..3\)"):
    mob.outage_trace([(4, 1, 2)], 4, 4)
  with pytest.raises(ValueError, match="rule='stay'; choose one of"):
    mob.fail_edges(m, up, rule="stay")


def test_a_membership_outside_the_tree_is_refused():
  with pytest.raises(ValueError, match=r"round 2 puts client 1 on edge 3, outside \[0, 2\)"):
    Membership(edges=np.array([[0, 1], [0, 3]]), up=np.ones((2, 2), bool))


# ------------------------------------------------------------------ the sampler
@pytest.mark.parametrize("cohort_size", [None, 2])
def test_under_a_fixed_tree_the_mobile_sampler_draws_the_cohort_samplers_cohorts(cohort_size):
  parent = np.array([0, 1, 0, 2, 1, 2, 2, 0, 1])
  static = cohort_sampler(parent, cohort_size, chunk_size=4)
  mobile = mobile_sampler(Membership.static(parent), cohort_size, chunk_size=4)
  assert mobile.padded_size == static.padded_size and mobile.chunk_size == static.chunk_size
  member, live = jnp.asarray(parent, jnp.int32), jnp.ones(3, bool)
  for i in range(5):
    a, b = static(jax.random.key(i)), mobile(jax.random.key(i), member, live)
    for x, y in zip(a[:3], b[:3], strict=True):
      assert np.array_equal(np.asarray(x), np.asarray(y))


def test_the_mobile_sampler_draws_each_edge_uniformly_among_its_members_of_the_round():
  member = jnp.asarray([0, 0, 0, 0, 1, 2, 2, 0, 2], jnp.int32)   # edge 0: 5 members, 1: 1, 2: 3, 3: none
  live = jnp.asarray([True, True, True, True])
  sampler = MobileSampler(num_clients=9, num_edges=4, per_edge=2, chunk_size=8)
  draw = jax.jit(lambda k: sampler(k, member, live))
  hits = np.zeros(9)
  trials = 4000
  for i in range(trials):
    c = draw(jax.random.key(i))
    clients, parent, valid = (np.asarray(v) for v in c[:3])
    assert np.bincount(parent[valid], minlength=4).tolist() == [2, 1, 2, 0]
    assert (np.asarray(member)[clients[valid]] == parent[valid]).all()
    assert len(set(clients[valid].tolist())) == int(valid.sum())
    hits[clients[valid]] += 1
  expect = np.array([2 / 5] * 4 + [1.0] + [2 / 3] * 2 + [2 / 5] + [2 / 3])
  assert np.all(np.abs(hits / trials - expect) < 5 * np.sqrt(expect * (1 - expect) / trials) + 1e-12)
  c = sampler(jax.random.key(0), member, jnp.asarray([False, True, True, True]))
  assert not np.asarray(c.valid)[np.asarray(c.parent) == 0].any()


# ------------------------------------------------------------------ the host against a plain loop
def _moving_problem(rounds=5):
  data, groups, model = small_problem()   # 9 clients in groups of 3, 2, 4
  topo = Topology.from_label_columns([np.asarray(groups)])
  m = mob.markov(np.asarray(groups), num_edges=3, num_rounds=rounds, dwell=2.0, seed=4)
  up = mob.outage_trace([(1, 2, 3)] + [(0, 4, rounds)] * (rounds >= 4), 3, rounds)
  return data, topo, model, mob.fail_edges(m, up, rule="wait")


def _reference(model, data, membership, x0, rounds, key, *, period, cohort=None, aggregate=None):
  """HierFAVG under a moving membership, by hand: every edge's live members of the round train from
  its model and it takes their weighted mean (``aggregate(x_e, [(client, model)])`` if given), every
  ``period`` rounds the root takes the live edges' mean weighted by their round's examples and sends
  it to the live edges."""
  n = np.asarray(data.n_train, np.float64)
  e = membership.num_edges
  x = [np64(x0) for _ in range(e)]
  for r in range(1, rounds + 1):
    rk = jax.random.fold_in(key, r - 1)
    member, live = membership.edges[r - 1], membership.up[r - 1]
    if cohort is None:
      chosen = [[c for c in range(len(member)) if member[c] == g and live[g]] for g in range(e)]
    else:   # the engine's draw (tested on its own above)
      draw = cohort(stream(rk, "cohort"), jnp.asarray(member), jnp.asarray(live))
      chosen = [[int(c) for c, p, v in zip(*(np.asarray(a) for a in draw[:3]), strict=True) if v and p == g]
                for g in range(e)]
    for g in range(e):
      if not chosen[g]:
        continue
      trained = [(c, np64(sgd_client(model, x[g], data, c, STEPS, train_key(rk, c), lr=LR, batch_size=B)[0]))
                 for c in chosen[g]]
      if aggregate is not None:
        x[g] = aggregate(x[g], trained)
      else:
        w = np.array([n[c] for c, _ in trained])
        x[g] = jax.tree.map(lambda *ms, w=w: sum(wi * mi for wi, mi in zip(w, ms, strict=True)) / w.sum(),
                            *[t for _, t in trained])
    if r % period == 0:
      wg = np.array([n[member == g].sum() if live[g] else 0.0 for g in range(e)])
      if wg.sum() > 0:
        root = jax.tree.map(lambda *ms, wg=wg: sum(wi * mi for wi, mi in zip(wg, ms, strict=True)) / wg.sum(),
                            *x)
        x = [root if live[g] else x[g] for g in range(e)]
  return x


@pytest.mark.parametrize("cohort_size", [None, 2])
def test_hierfavg_under_a_moving_membership_with_failures_matches_a_plain_loop(cohort_size):
  data, topo, model, membership = _moving_problem()
  alg = hierfavg(model=model, topology=topo, data=data, local_optimizer=optax.sgd(LR),
                 schedule=LocalSchedule(batch_size=B, steps=STEPS), periods=(2,), cohort_size=cohort_size,
                 chunk_size=4, membership=membership)
  key = jax.random.key(11)
  counted, traces = count_traces(alg)
  state, metrics = run_jit(counted, data, 5, key)
  assert len(traces) == 1   # the membership moved every round: one compile
  sampler = mobile_sampler(membership, cohort_size, chunk_size=4)
  want = _reference(model, data, membership, start(alg), 5, key, period=2,
                    cohort=None if cohort_size is None else sampler)
  for g in range(3):
    close(jax.tree.map(lambda a, g=g: a[g], state.params[1]), want[g])
  assert int(metrics["handovers"]) == int(membership.handovers[4])
  assert int(metrics["edges_down"]) == 1
  # every client is scored with its edge of the last round
  assert np.asarray(alg.models(state)["level1"].model_of_client).tolist() == membership.edges[4].tolist()


def test_a_moving_run_resumed_from_a_host_copy_equals_an_unbroken_one():
  """A checkpoint holds the state; the membership of a round is read from its index, so a run resumed in
  the middle of handovers and an outage goes on bit for bit."""
  from helpers import host_copy

  data, topo, model, membership = _moving_problem()
  alg = hierfavg(model=model, topology=topo, data=data, local_optimizer=optax.sgd(LR),
                 schedule=LocalSchedule(batch_size=B, steps=STEPS), periods=(2,), cohort_size=2, chunk_size=4,
                 membership=membership)
  step, key = jax.jit(alg.round), jax.random.key(1)

  def run(state, rounds):
    for _ in range(rounds):
      state, _ = step(state, data, jax.random.fold_in(key, state.round))
    return state

  straight = run(alg.init(jax.random.key(0)), 5)
  trees_equal(run(host_copy(run(alg.init(jax.random.key(0)), 3)), 2), straight)


def test_a_down_edge_keeps_its_model_and_takes_no_part_above():
  data, topo, model, _ = _moving_problem()
  membership = mob.fail_edges(Membership.static(topo.parent(2), 3), mob.outage_trace([(2, 1, 2)], 3, 2))
  alg = hierfavg(model=model, topology=topo, data=data, local_optimizer=optax.sgd(LR),
                 schedule=LocalSchedule(batch_size=B, steps=STEPS), periods=(1,), chunk_size=9,
                 membership=membership)
  state, metrics = run_jit(alg, data, 2, jax.random.key(0))
  x0 = start(alg)
  trees_equal(jax.tree.map(lambda a: a[2], state.params[1]), x0)   # down both rounds: untouched
  up_edges = jax.tree.map(lambda a: a[:2], state.params[1])
  trees_equal(up_edges, jax.tree.map(lambda a: jnp.stack([a[0], a[0]]), state.params[0]))
  assert int(metrics["edges_down"]) == 1 and int(metrics["edge_clients_max"]) == 3


def test_a_median_at_the_edges_follows_the_membership():
  data, topo, model, membership = _moving_problem(rounds=3)
  agg = median()
  alg = hierfavg(model=model, topology=topo, data=data, local_optimizer=optax.sgd(LR),
                 schedule=LocalSchedule(batch_size=B, steps=STEPS), periods=(3,), chunk_size=4,
                 membership=membership, update_paths=UpdatePath(aggregator=agg))
  key = jax.random.key(5)
  state, _ = run_jit(alg, data, 3, key)

  def by_hand(x, trained):   # the coordinate-wise median of the members' updates, by hand
    deltas = [jax.tree.map(lambda a, b: a - b, t, x) for _, t in trained]
    return jax.tree.map(lambda a, *d: a + np.median(np.stack(d), axis=0), x, *deltas)

  want = _reference(model, data, membership, start(alg), 3, key, period=3, aggregate=by_hand)
  for g in range(3):
    close(jax.tree.map(lambda a, g=g: a[g], state.params[1]), want[g])


def test_what_cannot_move_is_refused_by_name():
  data, topo, model, membership = _moving_problem()
  common = dict(model=model, topology=topo, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=STEPS), membership=membership)
  with pytest.raises(ValueError, match="hierfavg: sampling='data_size' under a moving membership"):
    hierfavg(**common, sampling="data_size", cohort_size=1)
  with pytest.raises(ValueError, match=r"cohort_size=\[1, 1, 1\] under a moving membership must be one int"):
    hierfavg(**common, cohort_size=[1, 1, 1])
  with pytest.raises(ValueError, match="the membership has 4 edges; the run's tree has 3 clients' parents"):
    hierfavg(**{**common, "membership": Membership.static(np.arange(9) % 4)})


# ------------------------------------------------------------------ every algorithm, through the registry
@pytest.fixture(scope="module")
def ctx():
  return small_context()


def _run_config(name, **fields):
  return ml_collections.ConfigDict({"algorithm": name, "chunk_size": 3, **ALGORITHM_CASES[name], **fields})


def _build(ctx, name, **fields):
  """``(fixed, moving)``: ``name`` on the config's tree where it runs on it (``tree="config"``), else on
  its own, without and with ``fields``."""
  tree = {"tree": "config"}
  try:
    fixed = registry.build_algorithm(name, _run_config(name, **tree), ctx)
  except ValueError:   # (no tree field, or a case's cohort larger than the config's groups)
    tree = {}
    fixed = registry.build_algorithm(name, _run_config(name), ctx)
  return fixed, registry.build_algorithm(name, _run_config(name, **tree, **fields), ctx)


def _rounds(ctx, alg, n=3):
  state, step = alg.init(jax.random.key(0)), jax.jit(alg.round)
  for r in range(n):
    state, metrics = step(state, ctx.data, jax.random.fold_in(jax.random.key(3), r))
  return state, metrics


FAST = ("hierfavg", "fedper", "knnper", "heterofl", "perfedavg", "fedex", "scaffold", "ifca")
"""The algorithms checked in the default run: the host, an edge-personal part, the methods that score a
client with its edge's model, a rule that moves, one refused, a family without the host."""


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ALGORITHM_CASES)])
def test_a_membership_that_never_moves_is_the_run_without_one_or_a_refusal(ctx, name):
  try:
    fixed, moving = _build(ctx, name, mobility={"model": "static"})
  except ValueError as e:
    msg = str(e)
    assert f"config.runs.{name}" in msg and ("cannot run a 'mobility' section" in msg or (
      "under a moving membership" in msg or "ServerRule.moves" in msg)), msg
    return
  a, _ = _rounds(ctx, fixed)
  counted, traces = count_traces(moving)
  b, metrics = _rounds(ctx, counted)
  trees_equal(a, b)
  assert len(traces) == 1 and int(metrics["handovers"]) == 0


def test_the_mobility_section(ctx):
  build = registry.build_algorithm
  alg = build("h", ml_collections.ConfigDict({"algorithm": "hierfavg", "mobility": {
    "model": "markov", "dwell": 2.0, "failures": {"rate": 0.3, "repair": 2}}}), ctx)
  _, metrics = _rounds(ctx, alg, 2)
  assert {"handovers", "edges_down", "edge_clients_max"} <= set(metrics)
  bad = [({"model": "walk"}, r"mobility.model='walk'; choose one of"),
         ({"model": "markov", "dwell": 0.0}, r"dwell=0.0 must be >= 1 round"),
         ({"model": "markov", "speed": 0.1}, r"mobility.speed is read by another model than model='markov'"),
         ({"model": "waypoint", "association": "tree"}, r"association='tree' with model='waypoint'"),
         ({"model": "trace"}, r"model='trace' needs mobility.trace"),
         ({"failures": {"rate": 0.1, "rule": "stay"}}, r"failures.rule='stay'; choose one of"),
         ({"speeed": 1.0}, r"mobility: unknown field 'speeed'")]
  for section, message in bad:
    with pytest.raises(ValueError, match=message):
      build("h", ml_collections.ConfigDict({"algorithm": "hierfavg", "mobility": section}), ctx)
  # compression (its per-client state travels with the client) and a robust aggregator at the edges
  for extra in ({"compression": {"uplink": {"name": "qsgd", "bits": 4}}}, {"aggregator": {"name": "median"}}):
    counted, traces = count_traces(build("h", ml_collections.ConfigDict(
      {"algorithm": "hierfavg", "mobility": {"model": "markov", "dwell": 2.0}, **extra}), ctx))
    _, metrics = _rounds(ctx, counted, 3)
    assert len(traces) == 1 and np.isfinite(float(metrics["train_loss"])), extra
  with pytest.raises(ValueError, match="algorithm 'bhfl' cannot run a 'mobility' section"):
    build("b", _run_config("bhfl", mobility={}), ctx)
  with pytest.raises(ValueError, match=r"hierfavg: a systems model .* under a moving membership"):
    build("s", ml_collections.ConfigDict({"algorithm": "hierfavg", "mobility": {}, "systems": {}}), ctx)
  with pytest.raises(ValueError, match=r"a secure section under a moving membership"):
    build("q", ml_collections.ConfigDict({"algorithm": "hierfavg", "mobility": {},
                                          "secure": {"mechanism": "none"}}), ctx)
  with pytest.raises(ValueError, match=r"scaffold: the server rule 'scaffold' keeps its state"):
    build("c", _run_config("scaffold", mobility={}), ctx)


def test_the_mobility_config_end_to_end(tmp_path):
  """A shrunk configs/mobility.py: its runs write their memberships (drawn), the rows say which edges
  were down and how many clients moved, the final table the busiest edge's megabytes."""
  import json

  from config_files import load_config

  from fedtree.experiment.runner import train_and_evaluate

  c = load_config("mobility")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 6, 3, 3, False
  c.data.group_sizes, c.data.test_examples, c.model.hidden = (6, 4), 8, (8,)
  keep = ("static", "fail_wait")
  c.runs = ml_collections.ConfigDict({k: c.runs[k] for k in keep})
  c.run_order = keep
  c.runs.fail_wait.mobility.failures = dict(rate=0.5, repair=2, rule="wait")
  results = train_and_evaluate(c, str(tmp_path))
  assert set(results) == set(keep)
  for run in keep:
    with np.load(tmp_path / f"membership_{run}.npz") as m:
      assert m["edges"].shape[1] == 10 and m["up"].shape[1] == 2
    assert (tmp_path / f"plot_membership_{run}.png").stat().st_size > 0
    assert "edge_peak_uplink_MB" in results[run]["global"]
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  fails = [r for r in rows if r["run"] == "fail_wait" and "handovers" in r]
  with np.load(tmp_path / "membership_fail_wait.npz") as m:
    up = m["up"]
  assert fails and all(r["edges_down"] == int((~up[r["round"] - 1]).sum()) for r in fails)
  assert all(r[f"edge{g}_down"] == int(not up[r["round"] - 1, g]) for r in fails for g in range(2)
             if not up[:, g].all())
  static = [r for r in rows if r["run"] == "static" and "handovers" in r]
  assert static and all(r["handovers"] == 0 for r in static)
  # the busiest edge's clients of a static tree: its 6 clients every round, one model each
  s = results["static"]["global"]
  assert np.isclose(s["edge_peak_uplink_MB"], s["clients_uplink_MB"] * 6 / 10)


def test_privacy_at_the_edges_accounts_the_largest_rate_of_the_moving_membership(ctx):
  """Every round each edge's noised sum is one sampled Gaussian over its members of the round, and a
  client is under one edge: ε is the composition, at the largest rate any edge samples in any round
  (dp-accounting's own), and every run under it compiles once."""
  import dp_accounting

  from fedtree.experiment.capabilities import mobility as mobility_section
  from fedtree.experiment.capabilities import privacy

  run = ml_collections.ConfigDict({
    "algorithm": "hierfavg", "weighting": "uniform", "cohort_size": 2,
    "mobility": {"model": "markov", "dwell": 3.0}, "privacy": {"clip_norm": 1.0, "noise_multiplier": 1.3}})
  rctx = registry.run_context(ctx, "p", run)
  plan = privacy.plan(dict(run.privacy), rctx, verbose=False)
  loads = mobility_section.membership_of(rctx).loads
  assert loads.tolist() == [[3, 3], [2, 4], [2, 4], [2, 4]]   # (the fixed tree's rate is 2/3)
  smallest = 2
  assert (plan.sampling_rate, plan.population, plan.cohort) == (1.0, 2, 2)
  # an edge of 2 members takes both: every round is a Gaussian mechanism without amplification
  run.cohort_size = 1
  plan = privacy.plan(dict(run.privacy), rctx.with_run(run), verbose=False)
  assert (plan.sampling_rate, plan.population, plan.cohort) == (1 / smallest, smallest, 1)
  acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
    smallest, 1, dp_accounting.GaussianDpEvent(1.3)), 4))
  assert privacy.epsilon_after(plan, 4) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  counted, traces = count_traces(registry.build_algorithm("p", run, ctx))
  _, metrics = _rounds(ctx, counted, 3)
  assert len(traces) == 1 and np.isfinite(float(metrics["train_loss"]))
  # what the accounting cannot bound is refused by name
  bad = [({"noise_level": 0}, r"noise_level=0 under a moving membership"),
         ({"normalize": "fixed"}, r"normalize='fixed' under a moving membership")]
  for extra, message in bad:
    with pytest.raises(ValueError, match=message):
      registry.build_algorithm("p", ml_collections.ConfigDict({**run.to_dict(), "privacy": {
        **run.privacy.to_dict(), **extra}}), ctx)
  with pytest.raises(ValueError, match=r"association='label_mix' \(it reads the clients' labels\)"):
    registry.build_algorithm("p", ml_collections.ConfigDict({**run.to_dict(), "mobility": {
      "association": "label_mix"}}), ctx)


def test_without_noise_privacy_at_the_edges_is_the_clipped_mean_of_the_round(ctx):
  """z = 0 and a clip no update reaches: the edges' counted mean is the uniform mean of their members of
  the round (the run without a privacy section, to float rounding)."""
  base = {"algorithm": "hierfavg", "weighting": "uniform", "mobility": {"model": "markov", "dwell": 1.5}}
  plain_run = registry.build_algorithm("a", ml_collections.ConfigDict(base), ctx)
  private = registry.build_algorithm("b", ml_collections.ConfigDict(
    {**base, "privacy": {"clip_norm": 1e6, "noise_multiplier": 0.0}}), ctx)
  a, _ = _rounds(ctx, plain_run, 3)
  b, _ = _rounds(ctx, private, 3)
  close(a.params, b.params, atol=1e-6)


def test_the_memory_estimate_holds_the_blocks_of_the_busiest_edge_of_any_round(ctx):
  """A blockwise aggregator holds every edge's cohort as a block: under a moving membership the block is
  the largest any edge holds in any round, not the tree's largest parent."""
  from fedtree.experiment import run as runs
  from fedtree.experiment.capabilities import mobility as mobility_section

  cfg = ml_collections.ConfigDict({"algorithm": "hierfavg", "aggregator": {"name": "median"},
                                   "mobility": {"model": "markov", "dwell": 1.5}})
  resolved = runs.resolve("m", cfg, ctx, build=False)
  loads = mobility_section.membership_of(registry.run_context(ctx, "m", cfg)).loads
  assert loads.max() > 3   # (the tree's parents hold 3 each)
  assert resolved.block[1:] == (2 * int(loads.max()), int(loads.max()), False)   # [edges, block] rows
  cfg.cohort_size = 2
  assert runs.resolve("m", cfg, ctx, build=False).block[1:] == (4, 2, False)


def test_label_counts_read_padded_and_ragged_rows_alike(ctx):
  """The label_mix association reads every client's label counts, from the padded layout or the ragged
  one (a flat train split with offsets) alike."""
  from fedtree.core.ragged import to_ragged_train
  from fedtree.experiment.capabilities.mobility import label_counts

  padded = label_counts(ctx.data)
  assert padded.sum(axis=1).tolist() == np.asarray(ctx.data.n_train).tolist()
  for c in range(ctx.data.num_clients):
    y = np.asarray(ctx.data.y_train[c][:int(ctx.data.n_train[c])])
    assert padded[c].tolist() == np.bincount(y, minlength=padded.shape[1]).tolist()
  assert np.array_equal(label_counts(to_ragged_train(ctx.data)), padded)
