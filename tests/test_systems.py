"""Systems heterogeneity (fedtree.toolbox.systems): device profiles, availability, round policies
against a per-client loop, the simulated clock in HierFAVG, and the runs they must equal."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import tiny_mlp_problem, trees_equal

from fedtree.algorithms import fedavg, hierfavg
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.sampling import Cohort
from fedtree.core.topology import Topology
from fedtree.toolbox.systems import (
  Systems,
  deadline,
  device_profile,
  diurnal_availability,
  lognormal,
  make_availability,
  make_profile,
  over_selection,
  wait_for_all,
)

STEPS = 4
ROUNDS = 2


@pytest.fixture(scope="module")
def problem():
  data, model, _ = tiny_mlp_problem()
  return data, model, LocalSchedule(batch_size=4, steps=STEPS, batch_order="fixed")


def run(problem, rounds=ROUNDS, seed=0, **kw):
  data, model, schedule = problem
  kw.setdefault("schedule", schedule)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1), chunk_size=None, **kw)
  rows = []
  state = loop.run(alg, data, num_rounds=rounds, key=jax.random.key(seed),
                   on_metrics=lambda r, m: rows.append(m))
  return state, rows


def uniform_profile(num_clients, speed, bandwidth=1e9):
  speed = np.broadcast_to(np.asarray(speed, np.float64), (num_clients,))
  return make_profile(speed, np.full(num_clients, bandwidth))


# ------------------------------------------------------------------------ bad input


def test_bad_input_names_the_value():
  with pytest.raises(ValueError, match=r"speed\[1\]=-2.0"):
    make_profile([1.0, -2.0], [1.0, 1.0])
  with pytest.raises(ValueError, match=r"up has 3 entries for 2 clients"):
    make_profile([1.0, 2.0], [1.0, 1.0, 1.0])
  for bad in (0.0, -5.0):
    with pytest.raises(ValueError, match=rf"deadline seconds={bad!r} must be"):
      deadline(bad)
  with pytest.raises(ValueError, match=r"dropout=1.0"):
    wait_for_all(dropout=1.0)
  with pytest.raises(ValueError, match=r"factor=0.5"):
    over_selection(0.5)
  with pytest.raises(ValueError, match=r"median=-1.0"):
    lognormal(-1.0, 1.0)
  prof = uniform_profile(3, 1.0)
  with pytest.raises(ValueError, match=r"availability has 2 clients, the device profile 3"):
    Systems(profile=prof, availability=make_availability([[(0, 1)], [(0, 1)]], 2.0))
  with pytest.raises(ValueError, match=r"interval \(3, 1\)"):
    make_availability([[(3, 1)]], 5.0)
  with pytest.raises(ValueError, match=r"uplink_bytes\[0\]=-1.0"):
    Systems(profile=prof, uplink_bytes=[-1.0, 0, 0])


def test_profile_for_other_clients_is_refused(problem):
  data, model, schedule = problem
  with pytest.raises(ValueError, match=r"device profile has 3 clients, the data 5"):
    fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule,
           systems=Systems(profile=uniform_profile(3, 1.0)))


# ------------------------------------------------------------------------ policies vs a loop


def reference_round(systems, clients, parent, valid, num_steps, time, model_size, alive, keep):
  """The policy, client by client (numpy); ``alive`` the slots that did not fail at random."""
  prof, pol = systems.profile, systems.policy
  speed, up, down = (np.asarray(a, np.float64) for a in prof)
  online = np.asarray(valid).copy()
  if systems.availability is not None:
    online &= np.asarray(systems.availability.at(time))[clients]
  alive = online & alive
  k = len(clients)
  steps = np.asarray(num_steps)[clients].astype(np.int64)
  comm = model_size / down[clients] + model_size / up[clients]
  secs = comm + steps / speed[clients]
  kept, new = alive.copy(), steps.copy()
  duration = 0.0
  if pol.kind == "deadline":
    for s in range(k):
      if not alive[s]:
        continue
      if pol.partial:
        fit = int(np.floor((pol.seconds - comm[s]) * speed[clients[s]]))
        new[s] = min(steps[s], max(fit, 0))
        kept[s] = (new[s] >= 1 or steps[s] == 0) and comm[s] <= pol.seconds
      else:
        kept[s] = secs[s] <= pol.seconds
  if pol.kind == "over_selection":
    for g in range(len(keep)):
      slots = [s for s in range(k) if parent[s] == g and alive[s]]
      slots.sort(key=lambda s: (secs[s], s))
      for s in slots[keep[g]:]:
        kept[s] = False
  for s in range(k):
    if kept[s]:
      duration = max(duration, comm[s] + new[s] / speed[clients[s]])
  if pol.kind == "deadline" and any(alive[s] and secs[s] > pol.seconds for s in range(k)):
    duration = pol.seconds
  return kept, np.where(kept, new, steps), duration


@pytest.mark.parametrize("policy", [
  wait_for_all(), wait_for_all(dropout=0.3), deadline(3.0), deadline(3.0, partial=True),
  deadline(2.0, partial=True, dropout=0.2), over_selection(1.5), over_selection(2.0, dropout=0.25),
], ids=lambda p: f"{p.kind}-{p.partial}-{p.dropout}")
def test_round_matches_a_client_loop(policy):
  num, k = 40, 24
  key = jax.random.key(3)
  prof = device_profile(jax.random.fold_in(key, 0), num, speed=lognormal(4.0, 0.8),
                        up=lognormal(2e5, 0.5), down=lognormal(8e5, 0.5))
  avail = diurnal_availability(jax.random.fold_in(key, 1), num, online_hours=12.0)
  systems = Systems(profile=prof, policy=policy, availability=avail)
  clients = np.asarray(jax.random.permutation(jax.random.fold_in(key, 2), num)[:k], np.int32)
  parent = np.repeat([0, 1], k // 2).astype(np.int32)
  valid = np.ones(k, bool)
  valid[-2:] = False
  num_steps = np.asarray(jax.random.randint(jax.random.fold_in(key, 3), (num,), 0, 12), np.int32)
  keep = (7, 9)
  step = jax.jit(lambda c, n, t, kk: systems.round(c, n, time=t, model_bytes=1e5, key=kk, keep=keep))
  for time in (0.0, 9.5 * 3600, 20 * 3600):
    rkey = jax.random.fold_in(key, int(time))
    out = step(
      Cohort(jnp.asarray(clients), jnp.asarray(parent), jnp.asarray(valid)), jnp.asarray(num_steps),
      jnp.float32(time), rkey)
    alive = np.asarray(jax.random.uniform(rkey, (k,))) >= policy.dropout   # the draw of systems.round
    kept, steps, duration = reference_round(systems, clients, parent, valid, num_steps, time, 1e5, alive,
                                            keep)
    np.testing.assert_array_equal(np.asarray(out.valid), kept)
    np.testing.assert_array_equal(np.asarray(out.num_steps)[clients[valid]], steps[valid])
    np.testing.assert_allclose(float(out.seconds), duration, rtol=1e-5)
    assert int(out.stats["clients_dropped"]) + int(out.stats["clients_unavailable"]) == int(
      valid.sum() - kept.sum())


def test_dropout_rate_matches_its_probability():
  num, p, rounds = 200, 0.3, 50
  systems = Systems(profile=uniform_profile(num, 1.0), policy=wait_for_all(dropout=p))
  cohort = Cohort(jnp.arange(num, dtype=jnp.int32), jnp.zeros(num, jnp.int32), jnp.ones(num, bool))
  step = jax.jit(lambda k: systems.round(cohort, jnp.ones(num, jnp.int32), time=0.0, model_bytes=1.0,
                                         key=k).valid)
  kept = np.stack([np.asarray(step(jax.random.key(r))) for r in range(rounds)])
  n = kept.size
  assert abs((1 - kept.mean()) - p) < 4 * np.sqrt(p * (1 - p) / n)   # 4 standard errors
  # ... and independently of the client: every client's rate within 4 standard errors of p
  per_client = 1 - kept.mean(axis=0)
  assert np.all(np.abs(per_client - p) < 4 * np.sqrt(p * (1 - p) / rounds) + 1e-9)


def test_diurnal_availability():
  num = 400
  avail = diurnal_availability(jax.random.key(0), num, online_hours=6.0, peak_hour=22.0, spread_hours=2.0)
  np.testing.assert_allclose(avail.fraction(), 0.25, rtol=1e-5)
  hours = np.arange(0, 48, 0.5)
  share = np.array([np.asarray(avail.at(h * 3600.0)).mean() for h in hours])
  np.testing.assert_array_equal(share[:48], share[48:])       # a day repeats
  assert share[hours == 22.0][0] > 0.6 > 0.05 > share[hours == 10.0][0]   # evening peak, morning trough
  # per client against its intervals, by hand
  t = 23.25 * 3600.0
  start, end, period = (np.asarray(a, np.float64) for a in avail)
  ref = np.any((start <= np.mod(t, period)[:, None]) & (np.mod(t, period)[:, None] < end), axis=1)
  np.testing.assert_array_equal(np.asarray(avail.at(t)), ref)


# ------------------------------------------------------------------------ runs


def test_deadline_everyone_meets_equals_todays_run(problem):
  data = problem[0]
  base_state, base_rows = run(problem, cohort_size=3)
  systems = Systems(profile=uniform_profile(data.num_clients, 10.0), policy=deadline(1e3, partial=True))
  state, rows = run(problem, cohort_size=3, systems=systems)
  trees_equal(state.params, base_state.params)
  for m, b in zip(rows, base_rows, strict=True):
    assert m["train_loss"] == b["train_loss"]
    assert (m["clients_dropped"], m["clients_partial"], m["clients_unavailable"]) == (0, 0, 0)
    # 4 steps at 10 steps/s plus 2 model transfers at 1 GB/s
    assert m["round_seconds"] == pytest.approx(STEPS / 10.0, rel=1e-3)
  assert rows[-1]["sim_seconds"] == pytest.approx(sum(m["round_seconds"] for m in rows), rel=1e-6)


def test_partial_work_equals_matching_step_counts(problem):
  data = problem[0]
  speed = np.array([10.0, 1.3, 2.6, 0.9, 1.7])   # steps per second
  limit = 2.05
  systems = Systems(profile=uniform_profile(data.num_clients, speed, bandwidth=1e12),
                    policy=deadline(limit, partial=True))
  state, rows = run(problem, systems=systems)
  steps = tuple(int(min(STEPS, np.floor(limit * s))) for s in speed)   # (4, 2, 4, 1, 3)
  assert min(steps) >= 1 and steps != (STEPS,) * 5
  ref_state, ref_rows = run(problem, schedule=LocalSchedule(batch_size=4, steps=steps, batch_order="fixed"))
  trees_equal(state.params, ref_state.params)
  assert [m["train_loss"] for m in rows] == [m["train_loss"] for m in ref_rows]
  assert [m["clients_partial"] for m in rows] == [sum(s < STEPS for s in steps)] * ROUNDS
  assert [m["round_seconds"] for m in rows] == [pytest.approx(limit)] * ROUNDS


def test_deadline_drops_the_slow_and_the_clock_decides_availability(problem):
  data = problem[0]
  speed = np.array([10.0, 1.0, 10.0, 1.0, 10.0])
  systems = Systems(profile=uniform_profile(data.num_clients, speed), policy=deadline(1.0))
  _, rows = run(problem, systems=systems)
  assert [m["clients_trained"] for m in rows] == [3, 3]
  assert [m["clients_dropped"] for m in rows] == [2, 2]
  assert [m["round_seconds"] for m in rows] == [pytest.approx(1.0)] * 2
  # client c on line only in [c, c + 1) of a 5-second period; each round lasts 0.4 s,
  # so rounds start at 0, 0.4, ..., and the one client on line at the start trains
  avail = make_availability([[(c, c + 1.0)] for c in range(5)], 5.0)
  systems = Systems(profile=uniform_profile(data.num_clients, 10.0), availability=avail)
  _, rows = run(problem, rounds=6, systems=systems)
  starts = 0.4 * np.arange(6)
  assert [m["clients_trained"] for m in rows] == [1] * 6
  assert [m["clients_unavailable"] for m in rows] == [4] * 6
  np.testing.assert_allclose([m["sim_seconds"] for m in rows], starts + 0.4, rtol=1e-5)


def test_over_selection_keeps_the_fastest(problem):
  data = problem[0]
  speed = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
  systems = Systems(profile=uniform_profile(data.num_clients, speed), policy=over_selection(2.0))
  _, rows = run(problem, cohort_size=2, systems=systems)
  for m in rows:   # 4 sampled of 5, the 2 fastest kept
    assert (m["clients_trained"], m["clients_dropped"]) == (2, 2)
    assert m["round_seconds"] in (pytest.approx(STEPS / s, rel=1e-4) for s in (3.0, 4.0))


def test_deterministic_and_tree_levels_add_time(problem):
  data, model, schedule = problem
  prof = device_profile(jax.random.key(1), data.num_clients, speed=lognormal(3.0, 1.0))
  avail = diurnal_availability(jax.random.key(2), data.num_clients, online_hours=20.0)
  systems = Systems(profile=prof, policy=deadline(1.5, partial=True, dropout=0.3), availability=avail,
                    level_seconds=100.0)
  groups = np.array([0, 0, 0, 1, 1])

  alg = hierfavg(model=model, topology=Topology.from_labels(groups), data=data, periods=(2,),
                 local_optimizer=optax.sgd(0.1), schedule=schedule, systems=systems, chunk_size=None)
  step = jax.jit(alg.round)

  def go(seed):   # loop.run's keys, one compilation for both runs
    state, rows = alg.init(jax.random.key(seed)), []
    for _ in range(4):
      state, m = step(state, data, jax.random.fold_in(jax.random.key(seed), state.round))
      rows.append({k: float(v) for k, v in m.items()})
    return state, rows

  (s1, r1), (s2, r2) = go(0), go(0)
  trees_equal(s1.params, s2.params)
  assert r1 == r2
  secs = [m["round_seconds"] for m in r1]
  assert all(s >= 100.0 for s in secs[1::2]) and all(s <= 1.5 for s in secs[0::2])
  assert float(s1.clock) == pytest.approx(sum(secs), rel=1e-6)
  assert sum(m["clients_dropped"] + m["clients_unavailable"] for m in r1) > 0


def test_bhfl_latencies_from_the_same_profiles():
  from fedtree.algorithms.hierarchical.bhfl.asynchrony import latency_from_systems

  speed = np.array([1.0, 2.0, 4.0, 0.5, 8.0])
  systems = Systems(profile=make_profile(speed, np.full(5, 1e3)))
  lat = latency_from_systems(systems, np.full(5, STEPS), 500.0, seconds_per_round=10.0)
  want = (STEPS / speed + 2 * 500.0 / 1e3) / 10.0     # steps and one model each way, in rounds
  np.testing.assert_allclose(np.asarray(lat.sample(jax.random.key(0), 5)), want, rtol=1e-6)
  with pytest.raises(ValueError, match=r"seconds_per_round=0.0 must be > 0"):
    latency_from_systems(systems, np.full(5, STEPS), 500.0, seconds_per_round=0.0)


@pytest.mark.slow
def test_bhfl_runs_with_latencies_from_profiles(problem):
  from fedtree.algorithms.hierarchical.bhfl import bhfl
  from fedtree.algorithms.hierarchical.bhfl.asynchrony import Latency, latency_from_systems

  data, model, schedule = problem
  systems = Systems(profile=make_profile([1.0, 2.0, 4.0, 0.5, 8.0], np.full(5, 1e3)))
  lat = latency_from_systems(systems, np.full(5, STEPS), 500.0, seconds_per_round=10.0)
  alg = bhfl(model=model, data=data, topology=Topology.from_labels(np.array([0, 0, 0, 1, 1])),
             local_optimizer=optax.sgd(0.1), schedule=schedule, latencies=(Latency(), lat), chunk_size=None)
  state, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
  assert np.isfinite(float(m["train_loss"]))


# ------------------------------------------------------------------------ bytes and server links


def test_tree_clock_from_compressed_bytes_and_server_links(problem):
  """The clock by hand: clients send QSGD-2 updates and receive an fp16 model; the edges send
  fp16 models up over their own links and receive the root's float32 model."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox.compression import downlink, fp16, qsgd, uplink

  data, model, schedule = problem
  speed = np.array([1.0, 2.0, 4.0, 0.5, 8.0])
  systems = Systems(profile=make_profile(speed, np.full(5, 100.0), np.full(5, 200.0)), level_seconds=1.0,
                    server_up=[[1e3, 2e3]], server_down=5e3)
  paths = {-1: UpdatePath(client=uplink(qsgd(bits=2)), down=downlink(fp16())),
           0: UpdatePath(client=uplink(fp16()))}
  alg = hierfavg(model=model, topology=Topology.from_labels(np.array([0, 0, 0, 1, 1])), data=data,
                 periods=(2,), local_optimizer=optax.sgd(0.1), schedule=schedule, systems=systems,
                 update_paths=paths, chunk_size=None)
  rows = []
  state = loop.run(alg, data, num_rounds=2, key=jax.random.key(0), on_metrics=lambda r, m: rows.append(m))
  sizes = [int(np.prod(a.shape[1:])) for a in jax.tree.leaves(state.params[0])]
  full, half = 4 * sum(sizes), 2 * sum(sizes)                 # float32 and fp16 models, bytes
  qsgd = sum(2 * n + 64 for n in sizes) / 8                    # 2 bits a coordinate + min, max
  clients = max(half / 200.0 + STEPS / s + qsgd / 100.0 for s in speed)
  edges = max(half / up + full / 5e3 for up in (1e3, 2e3))
  assert rows[0]["round_seconds"] == pytest.approx(clients, rel=1e-5)
  assert rows[1]["round_seconds"] == pytest.approx(clients + edges + 1.0, rel=1e-5)
  assert float(state.clock) == pytest.approx(2 * clients + edges + 1.0, rel=1e-5)


def test_server_links_bad_input(problem):
  data, model, schedule = problem
  prof = uniform_profile(5, 1.0)
  topo = Topology.from_labels(np.array([0, 0, 0, 1, 1]))
  common = dict(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule)
  for bad, match in (([1.0, 2.0], r"server_up has 2 entries; give one number, or one per server level"),
                     ([[1.0, 2.0, 3.0]],
                      r"server_up for level 1 has shape \(3,\); give one number or one per node \(2\)"),
                     ([[1.0, -2.0]], r"server_up of level 1 node 1=-2.0 must be")):
    with pytest.raises(ValueError, match=match):
      hierfavg(systems=Systems(profile=prof, server_up=bad), **common)
  with pytest.raises(ValueError, match=r"server_down needs server_up"):
    hierfavg(systems=Systems(profile=prof, server_down=1.0), **common)
