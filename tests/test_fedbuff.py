"""FedBuff (fedtree.algorithms.fedbuff): the reduction to FedAvg, staleness on a simulated clock
against a plain event loop, and bad input."""

import heapq

import jax
import numpy as np
import optax
import pytest
from helpers import tiny_mlp_problem, trees_equal

from fedtree.algorithms.fedbuff import fedbuff
from fedtree.algorithms.hierfavg import fedavg
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.systems import Systems, deadline, make_profile


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
  with pytest.raises(ValueError, match=r"wait_for_all policy"):
    fedbuff(buffer_size=3, systems=Systems(profile=prof, policy=deadline(5.0)), **common)


def test_server_update_is_the_staleness_weighted_mean(problem):
  """One server update against a client-by-client reference: every reporting client trained
  alone from the ring's model of its start version, Δ = Σ w_i (1+τ_i)^-½ Δ_i / Σ w_i."""
  import jax.numpy as jnp

  from fedtree.core.algorithm import local_training
  from fedtree.core.rng import stream
  from fedtree.core.sampling import Cohort
  from fedtree.core.tier import train_cohort

  data, model, schedule = problem
  speed = np.array([3.1, 0.53, 1.07, 2.03, 0.29])
  devices = Systems(profile=make_profile(speed, np.full(5, 1e12)))
  alg = fedbuff(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule, buffer_size=2,
                concurrency=5, max_staleness=3, systems=devices)

  update = local_training(None, model, optax.sgd(0.1), schedule, data)
  alone = jax.jit(lambda start, c, k: train_cohort(  # one client from one model
    update, start, Cohort(c[None], jnp.zeros(1, jnp.int32), jnp.ones(1, bool)), data,
    num_steps=schedule.num_steps(data.n_train), weights=data.n_train.astype(jnp.float32), key=k).delta_sum)
  step = jax.jit(alg.round)
  state, root, checked = alg.init(jax.random.key(0)), jax.random.key(1), 0
  for _ in range(6):
    key = jax.random.fold_in(root, state.round)
    new, m = step(state, data, key)
    report = ~np.asarray(new.busy)
    clients, versions = np.asarray(new.client)[report], np.asarray(new.version)[report]
    stale = int(state.round) - versions
    ok = stale <= 3
    delta, total = None, 0.0
    for c, v, s in zip(clients[ok], versions[ok], stale[ok], strict=True):
      start = jax.tree.map(lambda h, v=v: h[v % 4][None], state.history)
      trained = alone(start, jnp.int32(c), stream(key, "train"))
      contrib = jax.tree.map(lambda d, s=s: d[0] * (1.0 + s) ** -0.5, trained)
      delta = contrib if delta is None else jax.tree.map(jnp.add, delta, contrib)
      total += float(data.n_train[c])
    want = jax.tree.map(lambda p, d, t=total: p - d / t, state.params, jax.tree.map(lambda d: d[None], delta))
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
    checked += int((stale[ok] > 0).any())
    state = new
  assert checked >= 2   # rounds in which stale updates were weighted
