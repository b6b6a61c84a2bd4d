"""FedAsync (fedtree.algorithms.asynchronous.fedasync, a spec over FedBuff): the models of an event loop
written from Xie et al. 2019 on a simulated clock (three staleness functions), sequential SGD with one client
in flight, what happens to simultaneous arrivals, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_baselines as ref
from helpers import close, tiny_mlp_problem

from fedtree.algorithms import fedasync
from fedtree.algorithms.asynchronous.fedbuff import staleness_factor
from fedtree.core.local import LocalSchedule
from fedtree.core.rng import stream
from fedtree.toolbox.systems import Systems, make_profile

LR, B = 0.1, 4
SPEED = np.array([1.3, 0.7, 1.0, 1.9, 0.45])   # steps per second, no ties


@pytest.fixture(scope="module")
def problem():
  data, model, _ = tiny_mlp_problem()
  return data, model, LocalSchedule(batch_size=B, steps=3)


def _rows(alg, data, rounds, key):
  state, rows = alg.init(jax.random.key(7)), []
  step = jax.jit(alg.round)
  states = [state]
  for r in range(rounds):
    state, m = step(state, data, jax.random.fold_in(key, r))
    rows.append(m)
    states.append(state)
  return states, rows


@pytest.mark.parametrize("kind,want", [
  ("polynomial", lambda t: (t + 1.0) ** -0.5),
  pytest.param("hinge", lambda t: 1.0 if t <= 1 else 1.0 / (2.0 * (t - 1) + 1.0), marks=pytest.mark.slow),
])
def test_fedasync_matches_an_event_loop(problem, kind, want):
  data, model, schedule = problem
  systems = Systems(profile=make_profile(SPEED, np.full(5, 1e12)))
  alg = fedasync(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=schedule, concurrency=5,
                 systems=systems, alpha=0.6, staleness=kind, hinge_a=2.0, hinge_b=1)
  key = jax.random.key(3)
  states, rows = _rows(alg, data, 6, key)
  x0 = jax.tree.map(lambda p: p[0], states[0].params)
  models, stale = ref.fedasync_event_loop(model, x0, data, SPEED, np.full(5, 3), 6, key, lr=LR, batch_size=B,
                                          alpha=0.6, s=want)
  assert [int(m["max_staleness"]) for m in rows] == stale
  assert max(stale) >= 2   # some updates were stale
  for state, x in zip(states[1:], models[1:], strict=True):
    close(jax.tree.map(lambda p: p[0], state.params), x, tol=3e-5)


def test_a_downlink_transform_delivers_every_version_as_received(problem):
  """Issue 55: a downlink compressor at the asynchronous server (bfloat16 here, deterministic): every
  client trains from the version it started from as it was delivered, and the server mixes in its
  model; the event loop with the same delivery. The bytes down are the compressed model's."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox.compression import bf16, downlink

  data, model, schedule = problem
  systems = Systems(profile=make_profile(SPEED, np.full(5, 1e12)))
  alg = fedasync(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=schedule, concurrency=5,
                 systems=systems, alpha=0.6, update_paths=UpdatePath(down=downlink(bf16())))
  key = jax.random.key(3)
  states, rows = _rows(alg, data, 6, key)
  x0 = jax.tree.map(lambda p: p[0], states[0].params)
  half = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), tree)  # noqa: E731
  models, _ = ref.fedasync_event_loop(model, x0, data, SPEED, np.full(5, 3), 6, key, lr=LR, batch_size=B,
                                      alpha=0.6, s=lambda t: (t + 1.0) ** -0.5, receive=half)
  for state, x in zip(states[1:], models[1:], strict=True):
    close(jax.tree.map(lambda p: p[0], state.params), x, tol=3e-5)
  size = sum(int(np.size(a)) for a in jax.tree.leaves(x0))
  assert float(rows[-1]["downlink_bytes"]) == 2 * size   # two bytes an entry


def test_one_client_in_flight_is_sequential_sgd(problem):
  """concurrency=1, α = 1, one local step: every server update is one SGD step of one client on
  the server's model, x ← x − η ∇f_c(x; its batch)."""
  data, model, _ = problem
  alg = fedasync(model=model, data=data, local_optimizer=optax.sgd(LR),
                 schedule=LocalSchedule(batch_size=B, steps=1), alpha=1.0)
  key = jax.random.key(5)
  states, rows = _rows(alg, data, 5, key)
  assert [int(m["clients_trained"]) for m in rows] == [1] * 5
  assert [int(m["max_staleness"]) for m in rows] == [0] * 5
  x = jax.tree.map(lambda p: p[0], states[0].params)
  for r, state in enumerate(states[1:]):
    c = int(state.client[0])
    ck = jax.random.fold_in(stream(jax.random.fold_in(key, r), "train"), c)
    x, _ = ref.sgd_client(model, x, data, c, 1, ck, lr=LR, batch_size=B)
    close(jax.tree.map(lambda p: p[0], state.params), x, tol=1e-6)


@pytest.mark.slow   # (test_staleness_functions and the event loop are the fast siblings)
def test_simultaneous_arrivals(problem):
  """Without systems every client of equal work finishes at the same second: ``queue`` applies one
  a server update (the others a version staler each), ``together`` mixes all in one step (their mean
  of (1 − α) x + α y_k), ``drop`` applies one and discards the others."""
  data, model, schedule = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=schedule, concurrency=3,
                alpha=0.5, staleness="constant")
  key = jax.random.key(1)
  _, rows = _rows(fedasync(simultaneous="queue", **common), data, 3, key)
  assert [int(m["clients_trained"]) for m in rows] == [1, 1, 1]
  assert [int(m["max_staleness"]) for m in rows] == [0, 1, 2]
  assert [float(m["sim_seconds"]) for m in rows] == [3.0, 3.0, 3.0]
  states, rows = _rows(fedasync(simultaneous="together", weighting="uniform", **common), data, 1, key)
  assert int(rows[0]["clients_trained"]) == 3
  x = jax.tree.map(lambda p: p[0], states[0].params)
  rk = jax.random.fold_in(key, 0)
  ys = [ref.sgd_client(model, x, data, int(c), 3, jax.random.fold_in(stream(rk, "train"), int(c)), lr=LR,
                       batch_size=B)[0] for c in np.asarray(states[1].client)]
  want = jax.tree.map(lambda a, *y: 0.5 * np.asarray(a) + 0.5 * np.mean([np.asarray(v) for v in y], axis=0),
                      x, *ys)
  close(jax.tree.map(lambda p: p[0], states[1].params), want, tol=3e-5)
  _, rows = _rows(fedasync(simultaneous="drop", **common), data, 2, key)
  assert [int(m["clients_trained"]) for m in rows] == [1, 1]
  assert [int(m["clients_discarded"]) for m in rows] == [2, 2]   # the 3 restart together
  # a report the server discards (stale past max_staleness, or dropped on a simultaneous arrival)
  # was downloaded and sent: the byte columns count it, 3 messages each way a round
  from fedtree.toolbox.traffic import Traffic

  t = Traffic(100)
  for m in rows:
    t.add({k: np.asarray(v).item() for k, v in m.items() if np.ndim(v) == 0})
  assert t.summary()["uplink_MB"] * 1e6 == 600 and t.summary()["downlink_MB"] * 1e6 == 600


def test_staleness_functions():
  tau = jnp.arange(6)
  np.testing.assert_allclose(staleness_factor(tau, "polynomial", exponent=0.5), (np.arange(6) + 1.0) ** -0.5)
  np.testing.assert_allclose(staleness_factor(tau, "constant"), np.ones(6))
  np.testing.assert_allclose(staleness_factor(tau, "hinge", hinge_a=10.0, hinge_b=4),
                             [1, 1, 1, 1, 1, 1 / 11])


def test_fedasync_refusals(problem):
  data, model, schedule = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=schedule)
  with pytest.raises(ValueError, match=r"fedasync: alpha=0.0 must be in \(0, 1\]"):
    fedasync(alpha=0.0, **common)
  with pytest.raises(ValueError, match=r"fedasync: alpha=1.5 must be in \(0, 1\]"):
    fedasync(alpha=1.5, **common)
  with pytest.raises(ValueError, match=r"fedasync: rho=-0.1 must be a finite number >= 0"):
    fedasync(rho=-0.1, **common)
  from fedtree.core.local import sgd_client_update

  with pytest.raises(ValueError, match=r"give it or a client_update, not both"):
    plain = sgd_client_update(model, optax.sgd(LR), batch_size=B, max_steps=3)
    fedasync(rho=0.1, client_update=plain, **common)
  with pytest.raises(ValueError, match=r"fedasync: staleness='linear'; choose one of \('polynomial', "
                                       r"'constant', 'hinge'\)"):
    fedasync(staleness="linear", **common)
  with pytest.raises(ValueError, match=r"fedasync: simultaneous='first'; choose one of"):
    fedasync(simultaneous="first", **common)
  with pytest.raises(ValueError, match=r"fedasync: hinge_a=0.0 must be a finite number > 0"):
    fedasync(hinge_a=0.0, **common)
  with pytest.raises(ValueError, match=r"concurrency=9 must be in buffer_size..num_clients \(1..5\)"):
    fedasync(concurrency=9, **common)
