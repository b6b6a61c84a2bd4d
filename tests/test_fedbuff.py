"""FedBuff (fedtree.algorithms.asynchronous.fedbuff): the reduction to FedAvg, staleness on a simulated clock
against a plain event loop, and bad input."""

import heapq

import jax
import numpy as np
import optax
import pytest
from helpers import tier_kw, tiny_mlp_problem, trees_equal

from fedtree.algorithms import fedavg
from fedtree.algorithms.asynchronous.fedbuff import fedbuff
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.toolbox.systems import Systems, deadline, make_profile, over_selection, wait_for_all


@pytest.fixture(scope="module")
def problem():
  data, model, _ = tiny_mlp_problem()
  return data, model, LocalSchedule(batch_size=4, steps=3)


def run(alg, data, rounds, seed=0):
  rows = []
  state = loop.run(alg, data, num_rounds=rounds, key=jax.random.key(seed),
                   on_metrics=lambda r, m: rows.append(m))
  return state, rows


def test_buffer_equal_to_cohort_is_fedavg(problem):
  data, model, schedule = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule)
  avg_state, avg_rows = run(fedavg(cohort_size=3, chunk_size=None, **common), data, 3)
  buf_state, buf_rows = run(fedbuff(buffer_size=3, max_staleness=0, **common), data, 3)
  trees_equal(buf_state.params, avg_state.params[0])
  assert [m["train_loss"] for m in buf_rows] == [m["train_loss"] for m in avg_rows]
  assert [m["max_staleness"] for m in buf_rows] == [0, 0, 0]




def test_clock_and_staleness_match_an_event_loop(problem):
  data, model, schedule = problem
  speed = np.array([3.1, 0.53, 1.07, 2.03, 0.29])    # steps per second (no ties); 3 steps each
  systems = Systems(profile=make_profile(speed, np.full(5, 1e12)))
  # concurrency = all 5 clients, so who starts is forced (the freed clients restart)
  alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, buffer_size=2,
                concurrency=5, systems=systems, max_staleness=10)
  _, rows = run(alg, data, 6)
  clock, ver, inflight, want = 0.0, 0, [], []
  inflight = [(3.0 / s, c, 0) for c, s in enumerate(speed)]
  heapq.heapify(inflight)
  for _ in range(6):
    done = [heapq.heappop(inflight) for _ in range(2)]
    clock = max(t for t, _, _ in done)
    want.append((clock, [ver - v for _, _, v in done]))
    ver += 1
    for _, c, _ in done:   # the freed clients start again from the new version
      heapq.heappush(inflight, (clock + 3.0 / speed[c], c, ver))
  np.testing.assert_allclose([m["sim_seconds"] for m in rows], [w[0] for w in want], rtol=1e-5)
  np.testing.assert_allclose([m["max_staleness"] for m in rows], [max(w[1]) for w in want])
  np.testing.assert_allclose([m["mean_staleness"] for m in rows], [np.mean(w[1]) for w in want], rtol=1e-6)
  assert all(np.isfinite(m["train_loss"]) for m in rows)


def test_bad_input(problem):
  data, model, schedule = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule)
  with pytest.raises(ValueError, match=r"buffer_size=6 must be in 1..5"):
    fedbuff(buffer_size=6, **common)
  with pytest.raises(ValueError, match=r"concurrency=2 must be in buffer_size..num_clients"):
    fedbuff(buffer_size=3, concurrency=2, **common)
  with pytest.raises(ValueError, match=r"max_staleness=-1"):
    fedbuff(buffer_size=3, max_staleness=-1, **common)
  prof = make_profile(np.ones(5), np.ones(5))
  with pytest.raises(ValueError, match=r"fedbuff takes systems with the wait_for_all or deadline policy"):
    fedbuff(buffer_size=3, systems=Systems(profile=prof, policy=over_selection(1.5)), **common)
  tree = Topology.from_labels(np.array([0, 0, 0, 1, 1]))
  with pytest.raises(ValueError, match=r"buffer_size=3 must be in 1..2 \(the smallest group's clients"):
    fedbuff(buffer_size=3, topology=tree, **common)
  with pytest.raises(ValueError, match=r"periods\[0\]=0 must be >= 1"):
    fedbuff(buffer_size=2, topology=tree, periods=(0,), **common)
  from fedtree.core.updates import UpdatePath, identity

  with pytest.raises(ValueError, match=r"fedbuff runs an update path only at server level\(s\) \[1\] "
                                       r"\(got one at level 0\)"):   # the upper levels take the mean
    fedbuff(buffer_size=2, topology=tree, update_paths={0: UpdatePath(client=identity())}, **common)


def _one_client(model, schedule, data):
  """``(start [1, ...], client, key) -> n_c (x − θ_c)``: one client trained alone from one model."""
  import jax.numpy as jnp

  from fedtree.core.algorithm import local_training
  from fedtree.core.sampling import Cohort

  update = local_training(None, model, optax.sgd(0.1), schedule, data)
  return jax.jit(lambda start, c, k: tier_kw(
    update, start, Cohort(c[None], jnp.zeros(1, jnp.int32), jnp.ones(1, bool)), data,
    num_steps=schedule.num_steps(data.n_train), weights=data.n_train.astype(jnp.float32), key=k).delta_sum)


def _server_steps(alg, data, steps=6, max_staleness=3):
  """Every server step of ``alg``: ``(state before, state after, its key, the applied reports as
  (client, version, staleness))``."""
  step = jax.jit(alg.round)
  state, root = alg.init(jax.random.key(0)), jax.random.key(1)
  for _ in range(steps):
    key = jax.random.fold_in(root, state.round)
    new, _ = step(state, data, key)
    report = ~np.asarray(new.busy)
    clients, versions = np.asarray(new.client)[report], np.asarray(new.version)[report]
    stale = int(state.round) - versions
    ok = stale <= max_staleness
    yield state, new, key, list(zip(clients[ok], versions[ok], stale[ok], strict=True))
    state = new


def test_server_update_is_the_staleness_weighted_mean(problem):
  """One server update against a client-by-client reference: every reporting client trained
  alone from the ring's model of its start version, Δ = Σ w_i (1+τ_i)^-½ Δ_i / Σ w_i."""
  import jax.numpy as jnp

  from fedtree.core.rng import stream

  data, model, schedule = problem
  speed = np.array([3.1, 0.53, 1.07, 2.03, 0.29])
  devices = Systems(profile=make_profile(speed, np.full(5, 1e12)))
  alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, buffer_size=2,
                concurrency=5, max_staleness=3, systems=devices)
  alone = _one_client(model, schedule, data)
  checked = 0
  for state, new, key, applied in _server_steps(alg, data):
    delta, total = None, 0.0
    for c, v, s in applied:
      start = jax.tree.map(lambda h, v=v: h[v % 4][None], state.history)
      trained = alone(start, jnp.int32(c), stream(key, "train"))
      contrib = jax.tree.map(lambda d, s=s: d[0] * (1.0 + s) ** -0.5, trained)
      delta = contrib if delta is None else jax.tree.map(jnp.add, delta, contrib)
      total += float(data.n_train[c])
    want = jax.tree.map(lambda p, d, t=total: p - d / t, state.params, jax.tree.map(lambda d: d[None], delta))
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
    checked += int(any(s > 0 for _, _, s in applied))
  assert checked >= 2   # rounds in which stale updates were weighted


def event_loop(speed, steps, buffer, rounds, limit=None, partial=False):
  """FedBuff's clock, client by client: every client in flight from the start, the freed ones
  restarting; under a deadline a client that cannot finish fails at it (or does what fits)."""
  def start(t, c, ver):
    n = steps
    if limit is not None and partial:
      n = min(steps, int(np.floor(limit * speed[c])))
    secs = n / speed[c]
    failed = n < 1 or (limit is not None and secs > limit)
    return (t + (limit if failed else secs), c, ver, failed, n < steps and not failed)

  inflight = [start(0.0, c, 0) for c in range(len(speed))]
  heapq.heapify(inflight)
  ver, out = 0, []
  for _ in range(rounds):
    done = [heapq.heappop(inflight) for _ in range(buffer)]
    clock = max(d[0] for d in done)
    out.append((clock, sum(d[3] for d in done), sum(d[4] for d in done)))
    ver += 1
    for d in done:
      heapq.heappush(inflight, start(clock, d[1], ver))
  return out


@pytest.mark.parametrize("partial", [False, True])
def test_deadline_matches_an_event_loop(problem, partial):
  data, model, schedule = problem
  speed = np.array([3.1, 0.53, 1.07, 2.03, 0.29])   # 3 steps: clients 1 and 4 miss a 4-second deadline
  common = dict(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, buffer_size=2,
                concurrency=5, max_staleness=10)
  policy = deadline(4.0, partial=partial)
  _, rows = run(fedbuff(systems=Systems(profile=make_profile(speed, np.full(5, 1e12)), policy=policy),
                        **common), data, 6)
  want = event_loop(speed, 3, 2, 6, limit=4.0, partial=partial)
  np.testing.assert_allclose([m["sim_seconds"] for m in rows], [w[0] for w in want], rtol=1e-5)
  assert [m["clients_dropped"] for m in rows] == [w[1] for w in want]
  assert [m["clients_partial"] for m in rows] == [w[2] for w in want]
  assert sum(w[1] for w in want) > 0 if not partial else sum(w[2] for w in want) > 0
  if not partial:
    return
  # A deadline every client meets is the run without one, bitwise.
  fast = make_profile(np.full(5, 10.0), np.full(5, 1e12))
  met = Systems(profile=fast, policy=deadline(100.0, partial=partial))
  a, _ = run(fedbuff(systems=met, **common), data, 2)
  b, _ = run(fedbuff(systems=Systems(profile=fast), **common), data, 2)
  trees_equal(a.params, b.params)


def test_dropout_rate_matches_its_probability(problem):
  data, model, schedule = problem
  systems = Systems(profile=make_profile(np.ones(5), np.full(5, 1e12)), policy=wait_for_all(dropout=0.5))
  alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, buffer_size=5,
                systems=systems)
  _, rows = run(alg, data, 20)
  dropped = sum(m["clients_dropped"] for m in rows)
  assert all(m["clients_dropped"] + m["clients_trained"] == 5 for m in rows)
  # 100 Bernoulli(0.5) draws: standard deviation 0.05 of the rate; 4 of them
  assert abs(dropped / 100 - 0.5) < 0.2


def test_tree_is_hierfavg_when_every_slot_reports(problem):
  """Buffer = concurrency = cohort, no staleness: every clients' parent is FedAvg on its group and
  the root aggregates every round, as HierFAVG with the same cohorts."""
  from fedtree.algorithms.host.hierfavg import hierfavg

  data, model, schedule = problem
  tree = Topology.from_labels(np.array([0, 0, 0, 1, 1]))
  common = dict(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, topology=tree)
  hier, hrows = run(hierfavg(cohort_size=2, chunk_size=None, **common), data, 3)
  buf, brows = run(fedbuff(buffer_size=2, max_staleness=0, **common), data, 3)
  trees_equal(buf.upper_params[0], hier.params[0])
  trees_equal(buf.params, hier.params[1])
  np.testing.assert_allclose([m["train_loss"] for m in brows], [m["train_loss"] for m in hrows], rtol=1e-6)


def test_tree_clocks_meet_where_a_level_aggregates(problem):
  """Every parent on its own clock; the root (period 2) waits for the slowest and its links."""
  data, model, schedule = problem
  tree = Topology.from_labels(np.array([0, 0, 0, 1, 1]))
  speed = np.array([1.0, 1.0, 1.0, 2.0, 0.5])     # group 0: 3 s a round, group 1: 6 s
  systems = Systems(profile=make_profile(speed, np.full(5, 1e12)), server_up=[[1e3, 2e3]])
  alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, topology=tree,
                periods=(2,), buffer_size=2, max_staleness=0, systems=systems)
  state, rows = run(alg, data, 3)
  mb = 4 * sum(int(np.prod(a.shape[1:])) for a in jax.tree.leaves(state.params))
  t = 2 * mb / 1e3                                   # the slower edge link, up and down
  np.testing.assert_allclose([m["sim_seconds"] for m in rows], [6.0, 12.0 + t, 18.0 + t], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(state.node_clock), [15.0 + t, 18.0 + t], rtol=1e-5)
  assert sorted(alg.models(state)) == ["global", "level1"]


@pytest.mark.parametrize("update_from", ["start", "current"])
def test_a_robust_aggregator_takes_each_parents_buffer_of_staleness_scaled_updates(problem, update_from):
  """Issue 55: the coordinate-wise median over each server step's buffer, every applied report's
  update ``s(τ)(x_i − θ_i)`` from the model it started from (``"start"``) or the current one
  (``"current"``), against clients trained one at a time as in the mean's reference above."""
  import jax.numpy as jnp

  from fedtree.core.rng import stream
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import robust

  data, model, schedule = problem
  speed = np.array([3.1, 0.53, 1.07, 2.03, 0.29])
  devices = Systems(profile=make_profile(speed, np.full(5, 1e12)))
  alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, buffer_size=3,
                concurrency=5, max_staleness=3, systems=devices, update_from=update_from,
                update_paths=UpdatePath(aggregator=robust.median()))
  alone = _one_client(model, schedule, data)
  stale_seen = 0
  for state, new, key, applied in _server_steps(alg, data):
    updates = []
    for c, v, s in applied:
      start = jax.tree.map(lambda h, v=v: h[v % 4][None], state.history)
      delta = alone(start, jnp.int32(c), stream(key, "train"))   # n_c (x_v − θ_c)
      delta = jax.tree.map(lambda d, c=c: np.asarray(d[0], np.float64) / float(data.n_train[c]), delta)
      if update_from == "current":
        delta = jax.tree.map(lambda d, p, h, v=v: d + np.asarray(p[0], np.float64) - np.asarray(h[v % 4]),
                             delta, state.params, state.history)
      updates.append(jax.tree.map(lambda d, s=s: d * (1.0 + s) ** -0.5, delta))
    median = jax.tree.map(lambda *u: np.median(np.stack(u), axis=0), *updates)
    want = jax.tree.map(lambda p, m: np.asarray(p, np.float64) - m[None], state.params, median)
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(np.asarray(a), b, rtol=2e-5, atol=2e-6)
    stale_seen += int(any(s > 0 for _, _, s in applied))
  assert stale_seen >= 2


def test_central_noise_and_a_downlink_stay_refused_by_name(problem):
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import privacy as dp

  data, model, schedule = problem
  with pytest.raises(ValueError, match="fedbuff cannot run node transform 'dp' on its buffers: which reports "
                                       "a server step applies depends on the devices' simulated speeds"):
    fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, buffer_size=2,
            update_paths=UpdatePath(client=dp.clip(0.5), node=dp.central(0.5, 0.5)))
