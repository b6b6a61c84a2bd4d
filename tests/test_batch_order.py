"""Local batch orders (``LocalSchedule.batch_order``): fixed and sequential-cyclic against
hand-written batch sequences and a hand-computed FedAvg; shuffled is unchanged (the reference
tests of every algorithm still pass bit for bit)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import np_grad, tier_kw

from fedtree.algorithms import fedavg
from fedtree.algorithms.hierarchical.pfedmt import pfedmt
from fedtree.core.data import as_device, from_client_arrays
from fedtree.core.local import (
  BATCH_ORDERS,
  ClientData,
  ClientUpdate,
  LocalSchedule,
  batch_at,
  run_local_steps,
)
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.models import build_model


def _ids(cd, t, b, key=None):
  batch = batch_at(jax.random.key(0) if key is None else key, cd, jnp.asarray(t), b)
  return np.asarray(batch.y)[np.asarray(batch.mask)].tolist()


def test_fixed_reads_the_stored_order_every_epoch_whatever_the_key():
  m, n, b = 9, 7, 3
  cd = ClientData(x=jnp.arange(m, dtype=jnp.float32)[:, None], y=jnp.arange(m), n=jnp.asarray(n),
                  shuffle=False)
  for key in (jax.random.key(0), jax.random.key(5)):
    assert [_ids(cd, t, b, key) for t in range(6)] == [[0, 1, 2], [3, 4, 5], [6]] * 2
  last = batch_at(jax.random.key(0), cd, jnp.asarray(2), b)
  np.testing.assert_array_equal(last.mask, [True, False, False])
  np.testing.assert_array_equal(np.asarray(last.x)[1:], 0.0)  # padding zeroed


def test_cursor_resumes_the_stream():
  n, b = 5, 2  # batches per pass: [0, 1], [2, 3], [4]
  cd = ClientData(x=jnp.zeros((6, 1)), y=jnp.arange(6), n=jnp.asarray(n), shuffle=False)
  assert [_ids(cd._replace(cursor=2), t, b) for t in range(3)] == [[4], [0, 1], [2, 3]]
  # the shuffled stream is the cursor's too: step t at cursor c is step c + t at cursor 0
  sh = cd._replace(shuffle=True)
  assert _ids(sh._replace(cursor=4), 1, b) == _ids(sh, 5, b)


def test_bad_batch_order_is_refused():
  with pytest.raises(ValueError, match="batch_order='random'; choose one of"):
    LocalSchedule(batch_size=2, batch_order="random")
  assert BATCH_ORDERS == ("shuffled", "fixed", "cyclic")


def _probe_update(num_examples: int, batch_size: int, max_steps: int) -> ClientUpdate:
  """A client that counts how often it read each example (``y`` = example id); state
  ``int32[M]`` visit counts, plus the ids in reading order of its last round."""

  def step(carry, batch, rng):
    del rng
    counts, order, t = carry
    counts = counts + jnp.sum(jax.nn.one_hot(batch.y, num_examples, dtype=jnp.int32)
                              * batch.mask[:, None], axis=0)
    order = jax.lax.dynamic_update_slice(order, jnp.where(batch.mask, batch.y, -1), (t * batch_size,))
    return (counts, order, t + 1), jnp.zeros(())

  def apply(anchor, state, data, num_steps, key):
    order = -jnp.ones((max_steps * batch_size,), jnp.int32)
    (counts, order, _), loss = run_local_steps(
      step, (state[0], order, jnp.zeros((), jnp.int32)), data, num_steps, key,
      batch_size=batch_size, max_steps=max_steps)
    return anchor, (counts, order), loss

  return ClientUpdate(apply=apply)


def _id_data(sizes):
  train = [(np.zeros((n, 1), np.float32), np.arange(n, dtype=np.int32)) for n in sizes]
  return as_device(from_client_arrays(train, train, num_classes=max(sizes)))


def _probe_rounds(order, sizes, steps, rounds, cohort_size=None):
  data = _id_data(sizes)
  m, b = data.max_train, 2
  upd = _probe_update(m, b, steps)
  sched = LocalSchedule(batch_size=b, steps=steps, batch_order=order)
  sampler = cohort_sampler(np.zeros(len(sizes), int), cohort_size)
  params = jnp.zeros((1, 1))
  state = (jnp.zeros((len(sizes), m), jnp.int32), -jnp.ones((len(sizes), steps * b), jnp.int32))
  cursor = sched.init_cursor(len(sizes))
  seen, trained = [], []
  for r in range(rounds):
    key = jax.random.key(r)
    cohort = sampler(key)
    res = tier_kw(upd, params, cohort, data, num_steps=sched.num_steps(data.n_train),
                       weights=jnp.ones(len(sizes)), key=key, client_state=state,
                       batch_order=order, batch_size=b, cursor=cursor)
    state, cursor = res.client_state, res.cursor
    seen.append(np.asarray(state[1]))
    trained.append(set(np.asarray(cohort.clients)[np.asarray(cohort.valid)].tolist()))
  return np.asarray(state[0]), seen, cursor, trained


def test_cyclic_visits_every_example_once_per_pass_and_resumes_across_rounds():
  sizes, steps = [5, 7], 2  # 3 and 4 batches per pass; 2 steps per round
  counts, seen, cursor, _ = _probe_rounds("cyclic", sizes, steps, rounds=6)
  # client 0 (n=5): batches [0,1] [2,3] [4] [0,1] ... read two at a time, round after round
  expect0 = [[0, 1, 2, 3], [4, -1, 0, 1], [2, 3, 4, -1]] * 2
  assert [s[0].tolist() for s in seen] == expect0
  expect1 = [[0, 1, 2, 3], [4, 5, 6, -1]] * 3
  assert [s[1].tolist() for s in seen] == expect1
  # 12 steps: 4 passes of client 0 (3 batches) and 3 of client 1 (4 batches), each example
  # read once per pass
  np.testing.assert_array_equal(counts[0, :5], 4)
  np.testing.assert_array_equal(counts[1, :7], 3)
  np.testing.assert_array_equal(cursor, [12 % 3, 12 % 4])


def test_cyclic_cursor_moves_only_for_sampled_clients():
  sizes, steps = [5, 5, 5, 5], 1
  _, seen, cursor, trained = _probe_rounds("cyclic", sizes, steps, rounds=5, cohort_size=2)
  times = [sum(c in t for t in trained) for c in range(4)]
  np.testing.assert_array_equal(cursor, [t % 3 for t in times])
  for c in range(4):  # each client's k-th round of training reads its batch k (mod 3)
    rounds_of_c = [r for r in range(5) if c in trained[r]]
    firsts = [int(seen[r][c][0]) for r in rounds_of_c]
    assert firsts == [2 * (k % 3) for k in range(len(rounds_of_c))], (c, firsts)


def test_fixed_is_identical_across_rounds_and_shuffled_is_not():
  sizes, steps = [5, 7], 3
  _, seen, cursor, _ = _probe_rounds("fixed", sizes, steps, rounds=3)
  assert cursor == ()
  for s in seen[1:]:
    np.testing.assert_array_equal(s, seen[0])
  assert seen[0][1].tolist() == [0, 1, 2, 3, 4, 5]
  _, seen, _, _ = _probe_rounds("shuffled", sizes, steps, rounds=3)
  assert any(not np.array_equal(s, seen[0]) for s in seen[1:])


def _logreg_data(sizes, dim=3, classes=3, seed=0):
  rng = np.random.default_rng(seed)
  train = [(rng.normal(size=(n, dim)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32))
           for n in sizes]
  return as_device(from_client_arrays(train, train, num_classes=classes))


@pytest.mark.parametrize("order", ["fixed", "cyclic"])
def test_fedavg_by_hand(order):
  """FedAvg on logistic regression, SGD on minibatches taken in stored order, by hand."""
  sizes, b, steps, lr = [5, 3], 2, 2, 0.5
  data = _logreg_data(sizes)
  model = build_model("logreg", example_shape=(3,), num_classes=3)
  sched = LocalSchedule(batch_size=b, steps=steps, batch_order=order)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(lr), schedule=sched)
  state = alg.init(jax.random.key(1))
  k = np.asarray(state.params[0]["Dense_0"]["kernel"][0], np.float64)
  bias = np.asarray(state.params[0]["Dense_0"]["bias"][0], np.float64)
  cursor = [0, 0]
  step = jax.jit(alg.round)
  for r in range(3):
    state, _ = step(state, data, jax.random.key(10 + r))
    models = []
    for c, n in enumerate(sizes):
      xs, ys = np.asarray(data.x_train[c, :n], np.float64), np.asarray(data.y_train[c, :n])
      spe = -(-n // b)
      ck, cb = k.copy(), bias.copy()
      for t in range(steps):
        j = (cursor[c] + t) % spe if order == "cyclic" else t % spe
        gk, gb = np_grad(ck, cb, xs[j * b:(j + 1) * b], ys[j * b:(j + 1) * b])
        ck, cb = ck - lr * gk, cb - lr * gb
      if order == "cyclic":
        cursor[c] = (cursor[c] + steps) % spe
      models.append((ck, cb))
    w = np.asarray(sizes, np.float64) / sum(sizes)
    k = sum(wi * m[0] for wi, m in zip(w, models, strict=True))
    bias = sum(wi * m[1] for wi, m in zip(w, models, strict=True))
    got = state.params[0]["Dense_0"]
    np.testing.assert_allclose(got["kernel"][0], k, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["bias"][0], bias, rtol=1e-5, atol=1e-6)
  if order == "cyclic":
    np.testing.assert_array_equal(state.cursor, cursor)
  else:
    assert state.cursor == ()


def test_pfedmt_cursor_persists_across_team_iterations_and_rounds():
  sizes = [5, 7, 4, 6]
  data = _logreg_data(sizes)
  model = build_model("logreg", example_shape=(3,), num_classes=3)
  L, K, b = 2, 3, 2
  alg = pfedmt(model=model, topology=Topology.from_labels([0, 0, 1, 1]), data=data,
               schedule=LocalSchedule(batch_size=b, steps=L, batch_order="cyclic"), team_iters=K)
  state = alg.init(jax.random.key(0))
  step = jax.jit(alg.round)
  for r in range(2):
    state, _ = step(state, data, jax.random.key(r))
    spe = -(-np.asarray(sizes) // b)
    np.testing.assert_array_equal(state.cursor, ((r + 1) * K * L) % spe)


# ------------------------------------------------------------------------ the other hosts
def _other_hosts():
  from fedtree.algorithms.clustering import cfl
  from fedtree.algorithms.hierarchical.bhfl import bhfl
  from fedtree.algorithms.hierarchical.grouppfl import group_fedopt

  groups = np.array([0, 0, 1, 1])
  return {
    "bhfl": lambda common: bhfl(topology=Topology.from_labels(groups), **common),
    "cfl": lambda common: cfl(max_clusters=2, **common),
    "group_fedopt": lambda common: group_fedopt(groups=groups, server_optimizer=optax.sgd(1.0), **common),
  }


def _host_round(host, order, keys):
  sizes, b, steps = [5, 3, 4, 6], 2, 2
  data = _logreg_data(sizes)
  common = dict(model=build_model("logreg", example_shape=(3,), num_classes=3), data=data,
                local_optimizer=optax.sgd(0.5),
                schedule=LocalSchedule(batch_size=b, steps=steps, batch_order=order))
  alg = _other_hosts()[host](common)
  state = alg.init(jax.random.key(0))
  step = jax.jit(alg.round)
  return [step(state, data, k)[0] for k in keys], -(-np.asarray(sizes) // b), steps


@pytest.mark.parametrize("host", ["bhfl", "cfl", "group_fedopt"])
def test_fixed_order_under_other_hosts_ignores_the_batch_key(host):
  """B-HFL, the clustered methods and GroupPerFL's stages pass the schedule's batch order to
  train_cohort: under "fixed" a round (full cohorts, no latency) does not depend on its key
  (under the default "shuffled" order, which they used before, it does)."""
  (a, b), _, _ = _host_round(host, "fixed", (jax.random.key(1), jax.random.key(2)))
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("host", ["bhfl", "cfl", "group_fedopt"])
def test_cyclic_cursor_under_other_hosts(host):
  (state,), spe, steps = _host_round(host, "cyclic", (jax.random.key(1),))
  np.testing.assert_array_equal(state.cursor, steps % spe)


def test_config_batch_order_is_honoured():
  import ml_collections

  from fedtree.experiment.builders import schedule_from_config

  local = ml_collections.ConfigDict(dict(batch_size=4, epochs=1, batch_order="cyclic"))
  assert schedule_from_config(local).batch_order == "cyclic"
  del local.batch_order
  assert schedule_from_config(local).batch_order == "shuffled"
  local.batch_order = "sorted"
  with pytest.raises(ValueError, match="batch_order='sorted'; choose one of"):
    schedule_from_config(local)
