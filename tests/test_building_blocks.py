"""Topology, federated data, partitioners, in-jit batching, cohort sampling, aggregation,
evaluation: each against a plain computation, and each bad input with its clear error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.core.aggregation import weighted_mean
from fedtree.core.data import (
  FederatedData,
  from_client_arrays,
  partition_by_id,
  partition_dirichlet,
  partition_iid,
  partition_shards,
)
from fedtree.core.local import ClientData, LocalSchedule, batch_at
from fedtree.core.metrics import evaluate, summarize
from fedtree.core.sampling import cohort_sampler
from fedtree.core.server import server_optimizer
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic, synthetic_alpha_beta
from fedtree.models import build_model


# ------------------------------------------------------------------ topology
def test_topology_builders_agree():
  a = Topology.from_sizes([[2, 1], [3]])
  b = Topology.from_label_columns([[0, 0, 0, 1, 1, 1], [0, 0, 1, 2, 2, 2]])
  assert a == b and hash(a) == hash(b)
  assert a.depth == 3 and [a.num_nodes(lv) for lv in range(4)] == [1, 2, 3, 6]
  np.testing.assert_array_equal(a.ancestor(1), [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(a.leaf_counts(2), [2, 1, 3])
  np.testing.assert_array_equal(a.num_children(1), [2, 1])
  assert Topology.flat(4).depth == 1


@pytest.mark.parametrize("labels,match", [
  ([0, 2, 2], r"label\(s\) \[1\] have no clients"),
  ([0, -1], "negative label"),
  ([0.5, 1], "must hold integers"),
  ([], "empty"),
])
def test_topology_bad_labels(labels, match):
  with pytest.raises(ValueError, match=match):
    Topology.from_labels(labels)


def test_topology_columns_must_nest_and_agree():
  with pytest.raises(ValueError, match="spans two parents"):
    Topology.from_label_columns([[0, 0, 1], [0, 1, 1]])
  with pytest.raises(ValueError, match="disagree in length"):
    Topology.from_label_columns([[0, 0, 1], [0, 1]])
  with pytest.raises(ValueError, match="same depth|different depths"):
    Topology.from_sizes([[2, 2], 3])
  with pytest.raises(ValueError, match="no children"):
    Topology(parents=((0, 0), (0, 0)))


# ------------------------------------------------------------------ data
def test_from_client_arrays_pads_and_validates():
  rng = np.random.default_rng(0)
  train = [(rng.normal(size=(n, 3)).astype(np.float32), np.arange(n) % 2) for n in (2, 5)]
  test = [(rng.normal(size=(n, 3)).astype(np.float32), np.zeros(n, int)) for n in (1, 3)]
  d = from_client_arrays(train, test, num_classes=2)
  assert d.x_train.shape == (2, 5, 3) and d.x_test.shape == (2, 3, 3)
  np.testing.assert_array_equal(d.n_train, [2, 5])
  assert np.all(np.asarray(d.x_train)[0, 2:] == 0)
  with pytest.raises(ValueError, match="the tree has 3 clients but the data has 2"):
    d.validate(Topology.flat(3))
  with pytest.raises(ValueError, match=r"n_train\[1\]=9 is outside"):
    d.replace(n_train=np.array([2, 9])).validate()
  with pytest.raises(ValueError, match="no training examples"):
    d.replace(n_train=np.array([0, 5])).validate()


@pytest.mark.parametrize("part", ["iid", "dirichlet", "shards", "by_id"])
def test_partitioners_cover_every_example_once(part):
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 5, size=300)
  if part == "iid":
    parts = partition_iid(300, 7, rng)
  elif part == "dirichlet":
    parts = partition_dirichlet(labels, 7, 0.3, rng, min_size=5)
    assert min(len(p) for p in parts) >= 5
  elif part == "shards":
    parts = partition_shards(labels, 10, 2, rng)
    assert max(len(np.unique(labels[p])) for p in parts) <= 4  # 2 shards: few labels each
  else:
    parts, ids = partition_by_id(labels)
    assert len(parts) == 5 and all(np.all(labels[p] == i) for p, i in zip(parts, ids, strict=True))
  allidx = np.sort(np.concatenate(parts))
  np.testing.assert_array_equal(allidx, np.arange(300))


def test_dirichlet_small_alpha_skews_labels():
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 10, size=5000)
  skewed = partition_dirichlet(labels, 20, 0.05, rng)
  even = partition_dirichlet(labels, 20, 100.0, rng)
  ent = lambda ps: np.mean([len(np.unique(labels[p])) for p in ps])  # noqa: E731
  assert ent(skewed) < ent(even)
  with pytest.raises(ValueError, match="alpha=0"):
    partition_dirichlet(labels, 20, 0, rng)


def test_synthetic_recipes_are_deterministic_and_shaped():
  a = synthetic_alpha_beta(num_clients=5, samples_scale=1, max_examples=300, seed=1)
  b = synthetic_alpha_beta(num_clients=5, samples_scale=1, max_examples=300, seed=1)
  np.testing.assert_array_equal(a.x_train, b.x_train)
  assert a.x_train.shape[2] == 60 and a.num_classes == 10
  total = np.asarray(a.n_train) + np.asarray(a.n_test)
  assert total.min() >= 50
  # labels are the argmax of a linear model: more than one class per client in general
  assert len(np.unique(np.asarray(a.y_train)[0, : int(a.n_train[0])])) > 1
  d, g = grouped_synthetic(group_sizes=(5, 2), seed=0)
  assert d.num_clients == 7 and list(np.bincount(g)) == [5, 2]


# ------------------------------------------------------------------ local schedule and batching
def test_schedule_counts_and_errors():
  s = LocalSchedule(batch_size=4, epochs=2)
  np.testing.assert_array_equal(s.num_steps(np.array([1, 4, 5, 9])), [2, 2, 4, 6])
  assert s.max_steps(9) == 6
  np.testing.assert_array_equal(LocalSchedule(batch_size=4, steps=3).num_steps(np.array([1, 9])), [3, 3])
  per_client = LocalSchedule(batch_size=4, steps=[0, 5, 2])
  np.testing.assert_array_equal(per_client.num_steps(jnp.array([1, 9, 3])), [0, 5, 2])
  assert per_client.max_steps(9) == 5
  with pytest.raises(ValueError, match="3 per-client local steps for 2 clients"):
    per_client.num_steps(np.array([1, 2]))
  for kwargs, match in [(dict(batch_size=0), "batch_size=0"), (dict(batch_size=2, epochs=0), "epochs=0"),
                        (dict(batch_size=2, epochs=1, steps=2), "exactly one"),
                        (dict(batch_size=2, steps=-1), "steps=-1"),
                        (dict(batch_size=2, steps=(1, -2)), "must be non-empty and >= 0")]:
    with pytest.raises(ValueError, match=match):
      LocalSchedule(**kwargs)


def test_batches_visit_each_real_example_once_per_epoch():
  m, n, b = 11, 7, 3
  x = jnp.arange(m, dtype=jnp.float32)[:, None]
  cd = ClientData(x=x, y=jnp.arange(m), n=jnp.asarray(n))
  key = jax.random.key(0)
  for epoch in range(2):
    seen = []
    for j in range(3):  # ceil(7/3) = 3 batches per epoch
      batch = batch_at(key, cd, jnp.asarray(epoch * 3 + j), b)
      seen += np.asarray(batch.y)[np.asarray(batch.mask)].tolist()
      assert np.all(np.asarray(batch.x)[~np.asarray(batch.mask)] == 0)
    assert sorted(seen) == list(range(n)), seen
  e0 = [np.asarray(batch_at(key, cd, jnp.asarray(j), b).y).tolist() for j in range(3)]
  e1 = [np.asarray(batch_at(key, cd, jnp.asarray(3 + j), b).y).tolist() for j in range(3)]
  assert e0 != e1, "each epoch reshuffles"


# ------------------------------------------------------------------ sampling
def test_cohort_sampler_static_shapes_and_membership():
  parent = np.array([0, 1, 0, 1, 1, 2, 2])
  s = cohort_sampler(parent, [1, 2, 2], chunk_size=4)
  assert s.cohort_size == 5 and s.padded_size == 8
  seen = set()
  for i in range(20):
    c = s(jax.random.key(i))
    clients, par, valid = map(np.asarray, c)
    assert clients.shape == (8,) and valid.sum() == 5
    np.testing.assert_array_equal(parent[clients[valid]], par[valid])
    for g in range(3):
      members = clients[valid & (par == g)]
      assert len(set(members.tolist())) == len(members)  # without replacement
    seen.add(tuple(clients[valid]))
  assert len(seen) > 1
  full = cohort_sampler(parent, -1)(jax.random.key(0))
  assert sorted(np.asarray(full.clients).tolist()) == list(range(7))


def test_cohort_larger_than_group_is_an_error():
  with pytest.raises(ValueError, match=r"cohort_size=3 exceeds group 0, which has 2 clients"):
    cohort_sampler(np.array([0, 0, 1, 1, 1]), 3)
  with pytest.raises(ValueError, match="must be >= 1"):
    cohort_sampler(np.array([0, 0]), 0)


# ------------------------------------------------------------------ aggregation, servers, evaluation
def test_weighted_mean_per_segment_and_empty_segments():
  v = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}
  mean, total = weighted_mean(v, jnp.array([1.0, 3.0, 2.0]), jnp.array([0, 0, 2]), 3)
  np.testing.assert_allclose(mean["w"], [[2.5, 3.5], [0, 0], [5, 6]])
  np.testing.assert_allclose(total, [4, 0, 2])


def test_server_optimizer_names():
  assert server_optimizer("fedavg") is not None and server_optimizer("adam", learning_rate=0.1)
  with pytest.raises(ValueError, match="neither one of"):
    server_optimizer("fedbogus")
  with pytest.raises(ValueError, match="needs a learning_rate"):
    server_optimizer("fedadam")
  with pytest.raises(ValueError, match="rejected hyperparameters"):
    server_optimizer("sgd", learning_rate=1.0, bogus=2)


def test_evaluate_matches_a_loop_and_ignores_padding():
  data, groups = grouped_synthetic(group_sizes=(3, 2), dim=4, num_classes=3, test_examples=6, seed=0)
  n_test = np.array([6, 2, 4, 1, 5], np.int32)
  xt = np.asarray(data.x_test).copy()
  for c, n in enumerate(n_test):
    xt[c, n:] = 1e6
  model = build_model("logreg", example_shape=(4,), num_classes=3)
  params = jax.vmap(model.init)(jax.random.split(jax.random.key(0), 2))
  moc = np.array(groups)
  stats = evaluate(model, params, jnp.asarray(xt), data.y_test, jnp.asarray(n_test),
                   model_of_client=moc, chunk_size=2)
  for c in range(5):
    p = jax.tree.map(lambda a, c=c: a[moc[c]], params)
    logits = np.asarray(model.apply(p, xt[c, : n_test[c]]))
    correct = (logits.argmax(-1) == np.asarray(data.y_test)[c, : n_test[c]]).sum()
    assert float(stats.correct[c]) == correct and float(stats.count[c]) == n_test[c]
  s = summarize(stats, groups)
  assert s["group_accuracy"].shape == (2,) and 0 <= s["accuracy"] <= 1
  with pytest.raises(ValueError, match="pass model_of_client"):
    evaluate(model, params, data.x_test, data.y_test, data.n_test)


def test_model_names():
  with pytest.raises(ValueError, match="unknown; choose one of"):
    build_model("resnet9000", example_shape=(3,), num_classes=2)
  cnn = build_model("cnn", example_shape=(8, 8, 3), num_classes=4, features=(4,), dense=8)
  logits = cnn.apply(cnn.init(jax.random.key(0)), jnp.zeros((2, 8, 8, 3)), train=True, rng=jax.random.key(1))
  assert logits.shape == (2, 4)
  assert isinstance(FederatedData, type)


def test_shuffled_positions_is_a_uniform_looking_permutation():
  from fedtree.core.local import shuffled_positions

  for n in (1, 2, 3, 5, 17, 64, 1000):
    perm = np.asarray(shuffled_positions(jax.random.key(n), jnp.arange(n), jnp.asarray(n)))
    assert sorted(perm.tolist()) == list(range(n)), n
  # Where position 0 lands, over many keys, is close to uniform over [0, 10).
  firsts = np.asarray(jax.vmap(lambda k: shuffled_positions(k, jnp.zeros(1, jnp.int32), jnp.asarray(10)))(
    jax.random.split(jax.random.key(0), 4000)))[:, 0]
  counts = np.bincount(firsts, minlength=10)
  assert counts.min() > 300 and counts.max() < 500, counts


def test_chunk_size_choices():
  from fedtree.core.tuning import default_chunk_size

  parent = np.zeros(10, int)
  assert cohort_sampler(parent, 10, chunk_size="auto").chunk_size == default_chunk_size(10, group_sizes=[10])
  assert cohort_sampler(parent, 10, chunk_size=None).chunk_size == 10
  with pytest.raises(ValueError, match="chunk_size='fast'; choose an int"):
    cohort_sampler(parent, 10, chunk_size="fast")


def test_matmul_conv_equals_xla_conv_in_value_and_gradient():
  from fedtree.models import CNN

  x = jax.random.normal(jax.random.key(0), (2, 10, 10, 3))
  a = CNN(num_classes=4, features=(5, 6), dense=8, conv_impl="matmul")
  b = CNN(num_classes=4, features=(5, 6), dense=8, conv_impl="xla")
  params = a.init(jax.random.key(1), x)["params"]
  assert jax.tree.structure(params) == jax.tree.structure(b.init(jax.random.key(1), x)["params"])
  np.testing.assert_allclose(a.apply({"params": params}, x), b.apply({"params": params}, x),
                             rtol=1e-4, atol=1e-5)
  ga = jax.grad(lambda p: jnp.sum(a.apply({"params": p}, x) ** 2))(params)
  gb = jax.grad(lambda p: jnp.sum(b.apply({"params": p}, x) ** 2))(params)
  jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-3, atol=1e-4), ga, gb)
  with pytest.raises(ValueError, match="conv impl='fft'"):
    CNN(num_classes=4, conv_impl="fft").init(jax.random.key(1), x)


@pytest.mark.parametrize("shape", [(2, 8, 6, 3), (2, 7, 9, 4)])
def test_reshape_max_pool_equals_flax_max_pool_in_value_and_gradient(shape):
  import flax.linen as nn

  from fedtree.models import max_pool

  x = jax.random.normal(jax.random.key(0), shape)  # continuous: no tied maxima
  np.testing.assert_array_equal(max_pool(x), nn.max_pool(x, (2, 2), strides=(2, 2)))
  ga = jax.grad(lambda v: jnp.sum(jnp.sin(max_pool(v))))(x)
  gb = jax.grad(lambda v: jnp.sum(jnp.sin(nn.max_pool(v, (2, 2), strides=(2, 2)))))(x)
  np.testing.assert_allclose(ga, gb, rtol=1e-6)
  assert int(jnp.sum(ga != 0)) == x.shape[0] * (shape[1] // 2) * (shape[2] // 2) * shape[3]


def test_persistent_sgd_update_starts_from_and_keeps_the_client_model():
  import optax

  from fedtree.core.local import sgd_client_update

  model = build_model("logreg", example_shape=(3,), num_classes=2)
  anchor, own = model.init(jax.random.key(0)), model.init(jax.random.key(1))
  cd = ClientData(x=jax.random.normal(jax.random.key(2), (6, 3)), y=jnp.arange(6) % 2, n=jnp.asarray(6))
  key = jax.random.key(3)
  plain = sgd_client_update(model, optax.sgd(0.1), batch_size=3, max_steps=2)
  kept = sgd_client_update(model, optax.sgd(0.1), batch_size=3, max_steps=2, persistent=True)
  p_plain, s_plain, _ = plain.apply(anchor, own, cd, jnp.asarray(2), key)
  p_kept, s_kept, _ = kept.apply(anchor, own, cd, jnp.asarray(2), key)
  chex_equal = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)  # noqa: E731
  chex_equal(s_plain, own)                       # stateless: state passes through
  chex_equal(s_kept, p_kept)                     # persistent: the trained model is kept
  chex_equal(kept.apply(own, own, cd, jnp.asarray(2), key)[0], p_kept)   # it started from `own`
  chex_equal(plain.apply(anchor, anchor, cd, jnp.asarray(2), key)[0], p_plain)
  assert not np.allclose(p_plain["Dense_0"]["kernel"], p_kept["Dense_0"]["kernel"])


def test_local_training_defaults_to_sgd_and_refuses_state_where_asked():
  import optax

  from fedtree.core.algorithm import local_training
  from fedtree.core.local import ClientUpdate, LocalSchedule

  data = FederatedData(
    x_train=np.zeros((2, 5, 3), np.float32), y_train=np.zeros((2, 5), np.int32),
    n_train=np.asarray([5, 3], np.int32), x_test=np.zeros((2, 1, 3), np.float32),
    y_test=np.zeros((2, 1), np.int32), n_test=np.ones(2, np.int32), num_classes=2,
  )
  model = build_model("logreg", example_shape=(3,), num_classes=2)
  update = local_training(None, model, optax.sgd(0.1), LocalSchedule(batch_size=2), data)
  assert update.init_state is None
  stateful = ClientUpdate(apply=update.apply, init_state=lambda params, n: ())
  assert local_training(stateful, model, optax.sgd(0.1), LocalSchedule(batch_size=2), data) is stateful
  with pytest.raises(ValueError, match="ifca: the client update must be stateless"):
    local_training(stateful, model, optax.sgd(0.1), LocalSchedule(batch_size=2), data,
                   stateless_for="ifca")
