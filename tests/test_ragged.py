"""Ragged (flat + offsets) client data: same batches and same local training as the padded
layout, memory that grows with the total number of examples."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedtree.core import ragged
from fedtree.core.data import from_client_arrays
from fedtree.core.local import ClientData, SGDCarry, batch_at, make_sgd_step, run_local_steps
from fedtree.models import build_model


def _clients(sizes=(3, 11, 1, 6), dim=4):
  rng = np.random.default_rng(0)
  return [(rng.normal(size=(n, dim)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32))
          for n in sizes]


def test_round_trip_and_bytes():
  clients = _clients()
  padded = from_client_arrays(clients, [(x[:0], y[:0]) for x, y in clients], num_classes=3)
  r = ragged.from_padded(padded)
  np.testing.assert_array_equal(r.offsets, [0, 3, 14, 15, 21])
  np.testing.assert_array_equal(r.counts, [3, 11, 1, 6])
  x, y, n = ragged.to_padded(r)
  np.testing.assert_array_equal(x, padded.x_train)
  np.testing.assert_array_equal(y, padded.y_train)
  np.testing.assert_array_equal(n, padded.n_train)
  assert r.nbytes == 21 * 4 * 4 + 21 * 4 + 5 * 4
  assert ragged.padded_bytes(r.counts, 16) == 4 * 11 * 16
  assert ragged.ragged_bytes(r.counts, 16) == 21 * 16 + 5 * 4
  with pytest.raises(ValueError, match="split='valid'"):
    ragged.from_padded(padded, "valid")
  with pytest.raises(ValueError, match="client 0 has 2 x rows but 1 labels"):
    ragged.from_client_arrays([(np.zeros((2, 1)), np.zeros(1))], num_classes=2)


@pytest.mark.parametrize("shuffle", [True, False])
def test_ragged_batches_and_training_equal_padded(shuffle):
  clients = _clients()
  padded = from_client_arrays(clients, [(x[:0], y[:0]) for x, y in clients], num_classes=3)
  r = ragged.from_padded(padded)
  cohort = jnp.asarray([3, 1, 0])
  key = jax.random.key(4)
  pdata = ClientData(x=padded.x_train[cohort], y=padded.y_train[cohort], n=padded.n_train[cohort],
                     cursor=jnp.zeros((3,), jnp.int32), shuffle=jnp.full((3,), shuffle))
  rdata = ragged.client_data(r, cohort, shuffle=jnp.full((3,), shuffle))
  axes = ragged.client_axes(shuffle_batched=True)
  for t in range(5):
    bp = jax.vmap(lambda d, t=t: batch_at(key, d, t, 4))(pdata)
    br = jax.vmap(lambda d, t=t: batch_at(key, d, t, 4), in_axes=(axes,))(rdata)
    for a, b in zip(bp, br, strict=True):
      np.testing.assert_array_equal(a, b)

  model = build_model("logreg", example_shape=(4,), num_classes=3)
  opt = optax.sgd(0.3)
  step = make_sgd_step(model, opt)
  params = model.init(jax.random.key(0))

  def train(d):
    carry = SGDCarry(params=params, opt_state=opt.init(params), anchor=params)
    carry, loss = run_local_steps(step, carry, d, jnp.asarray(6), key, batch_size=4, max_steps=6)
    return carry.params, loss

  p1, l1 = jax.jit(jax.vmap(train))(pdata)
  p2, l2 = jax.jit(jax.vmap(train, in_axes=(axes,)))(rdata)
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # the clients really differ (the test can fail if offsets were ignored)
  assert not np.allclose(np.asarray(l2)[0], np.asarray(l2)[1])


def test_long_tail_memory_grows_with_examples():
  counts = (np.random.default_rng(0).lognormal(3, 1.5, 10_000)).astype(np.int64) + 1
  ratio = ragged.padded_bytes(counts, 4 * 20) / ragged.ragged_bytes(counts, 4 * 20)
  assert ratio > 50


# ------------------------------------------------------------------ the ragged training layout
def _long_tail_data():
  from fedtree.datasets.synthetic import grouped_synthetic

  data, groups = grouped_synthetic(group_sizes=(3, 3), dim=6, num_classes=3, seed=0)
  # make the sizes long-tailed: client c keeps 2 + 7c of its padded rows (at most M)
  m = data.x_train.shape[1]
  n = np.minimum(np.asarray(data.n_train), np.minimum(m, 2 + 7 * np.arange(data.num_clients)))
  n = n.astype(np.int32)
  return data.replace(n_train=n).validate(), groups


def test_to_ragged_train_round_trip_take_and_validate():
  data, _ = _long_tail_data()
  r = ragged.to_ragged_train(data)
  assert r.ragged and not data.ragged
  assert r.x_train.shape[0] == int(np.sum(data.n_train)) and r.max_train == int(np.max(data.n_train))
  assert r.num_clients == data.num_clients and r.example_shape == data.example_shape
  back = ragged.to_padded_train(r)
  for c in range(data.num_clients):
    k = int(data.n_train[c])
    np.testing.assert_array_equal(np.asarray(back.x_train)[c, :k], np.asarray(data.x_train)[c, :k])
  sub = r.take([4, 1])
  np.testing.assert_array_equal(sub.n_train, np.asarray(data.n_train)[[4, 1]])
  k4 = int(data.n_train[4])
  np.testing.assert_array_equal(sub.x_train[:k4], np.asarray(data.x_train)[4, :k4])
  with pytest.raises(ValueError, match="ragged client 0: rows 1000:1002 are outside the 70 flat"):
    r.replace(train_offset=np.asarray(r.train_offset) + 1000).validate()
  with pytest.raises(ValueError, match="ragged_max_train=3"):
    r.replace(ragged_max_train=3).validate()


@pytest.mark.parametrize("batch_order", ["shuffled", "cyclic"])
def test_training_on_the_ragged_layout_equals_padded(batch_order):
  """FedAvg over a two-level tree (persistent cursors under "cyclic"): every round's models
  are the same on the flat layout as on the padded one."""
  from fedtree.algorithms import hierfavg
  from fedtree.core import loop
  from fedtree.core.data import as_device
  from fedtree.core.local import LocalSchedule
  from fedtree.core.topology import Topology

  data, groups = _long_tail_data()
  model = build_model("logreg", example_shape=data.example_shape, num_classes=3)

  def final(d):
    alg = hierfavg(model=model, topology=Topology.from_labels(groups), data=d, local_optimizer=optax.sgd(0.1),
                   schedule=LocalSchedule(batch_size=4, epochs=1, batch_order=batch_order), cohort_size=2,
                   chunk_size=2)
    return loop.run(alg, d, num_rounds=3, key=jax.random.key(0)).params

  padded, flat = final(as_device(data)), final(as_device(ragged.to_ragged_train(data)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), padded, flat)


def test_what_reads_padded_rows_refuses_the_ragged_layout():
  from fedtree.algorithms import ifca
  from fedtree.core import loop
  from fedtree.core.data import as_device
  from fedtree.core.local import LocalSchedule

  data, _ = _long_tail_data()
  r = as_device(ragged.to_ragged_train(data))
  model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
  alg = ifca(model=model, data=r, num_clusters=2, local_optimizer=optax.sgd(0.1),
             schedule=LocalSchedule(batch_size=4, epochs=1), cohort_size=2)
  with pytest.raises(ValueError, match="IFCA's cluster losses .* does not take the ragged layout"):
    loop.run(alg, r, num_rounds=1, key=jax.random.key(0))


def test_config_layout_ragged_gives_the_padded_results(tmp_path):
  from config_files import load_config

  from fedtree import experiment

  def run(layout):
    c = load_config("quickstart")
    c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.checkpoint_every = 2, 2, 2, False, 0
    c.data.group_sizes, c.data.layout = (3, 2), layout
    c.runs = {"fedavg": {"algorithm": "fedavg", "cohort_size": 3}}
    c.run_order = ("fedavg",)
    return experiment.train_and_evaluate(c, None)["fedavg"]["global"]["accuracy"]

  assert run("ragged") == pytest.approx(run("padded"), abs=1e-6)
  with pytest.raises(ValueError, match=r"config.data.layout='flat'; choose one of \('padded', 'ragged'\)"):
    run("flat")
