"""Clustered FL (paper 004 and its baselines): the clustering pieces, CFL, IFCA, AWCFL and
MCFL against plain per-client loops (``reference_clustering.py``), their reductions, config
errors, one compile per round, the data transforms and the shipped config end to end."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_clustering as ref
from config_files import load_config
from helpers import close, count_traces

from fedtree import evaluation
from fedtree.algorithms import awcfl, cfl, fedavg, ifca, mcfl
from fedtree.algorithms.clustering import ops as clustering
from fedtree.algorithms.clustering.cfl import split_clusters
from fedtree.algorithms.clustering.mcfl import select_clusters
from fedtree.core import loop, metrics
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.datasets.prototypes import prototype_images
from fedtree.datasets.transforms import transform_clients, transform_random_clients
from fedtree.experiment.runner import train_and_evaluate
from fedtree.models import build_model

LR, BATCH = 0.2, 8


@pytest.fixture(scope="module")
def problem():
  """6 clients of 4x4 images, 3 of them flipped; a tiny MLP."""
  data = prototype_images(num_clients=6, num_examples=150, num_classes=3, image_size=4, blobs=2,
                          noise=0.2, alpha=1.0, test_fraction=0.25, seed=0)
  data, flags = transform_random_clients(data, num_transformed=3, kind="hflip", seed=0)
  data = as_device(data)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=data.num_classes, hidden=(5,))
  sched = LocalSchedule(batch_size=BATCH, steps=3)
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, weighting="examples")
  weights = np.asarray(data.n_train, np.float64)
  steps = np.full(data.num_clients, 3)
  return dict(data=data, flags=flags, model=model, kw=kw, weights=weights, steps=steps)


def _rows(tree, k):
  return [ref.row(tree, j) for j in range(k)]


# ------------------------------------------------------------------ clustering pieces
def _blobs(seed=0, per=6):
  rng = np.random.default_rng(seed)
  centers = np.array([[0.0, 0.0, 0.0], [8.0, 0.0, 1.0], [0.0, 9.0, -2.0]])
  x = np.concatenate([c + 0.2 * rng.normal(size=(per, 3)) for c in centers])
  return x.astype(np.float32), np.repeat(np.arange(3), per), centers


def test_kmeans_recovers_separated_clusters_and_ignores_masked_points():
  x, truth, _ = _blobs()
  x_bad = np.concatenate([x, np.full((2, 3), 1e3, np.float32)])
  mask = np.arange(len(x_bad)) < len(x)
  km = jax.jit(clustering.kmeans, static_argnums=2)
  for seed in range(3):
    res = km(jax.random.key(seed), jnp.asarray(x_bad), 3, mask=jnp.asarray(mask))
    a = np.asarray(res.assignment)[: len(x)]
    # same partition as the truth, whatever the labels
    assert len({(int(t), int(p)) for t, p in zip(truth, a, strict=True)}) == 3
    assert np.abs(np.asarray(res.centroids)).max() < 20   # the masked far points pulled nothing


def test_kmeans_lloyd_matches_reference():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(15, 4)).astype(np.float32)
  init = x[[0, 5, 9]]
  res = clustering.kmeans(jax.random.key(0), jnp.asarray(x), 3, iters=7, init=jnp.asarray(init))
  cents, assign = ref.lloyd(x, init, 7)
  np.testing.assert_array_equal(np.asarray(res.assignment), assign)
  np.testing.assert_allclose(np.asarray(res.centroids), cents, atol=1e-5)


def test_cluster_ids_are_stable_under_permutation():
  x, truth, centers = _blobs()
  stable = jax.jit(clustering.stable_kmeans)
  for perm in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
    previous = jnp.asarray(centers[perm], jnp.float32)
    for seed in range(3):   # different k-means++ draws, same ids
      res = stable(jax.random.key(seed), jnp.asarray(x), previous)
      expected = np.argsort(perm)[truth]           # truth cluster t sits at slot perm.index(t)
      np.testing.assert_array_equal(np.asarray(res.assignment), expected)
      np.testing.assert_allclose(np.asarray(res.centroids), centers[perm], atol=0.3)
  new = np.random.default_rng(2).normal(size=(4, 5))
  labels = clustering.match_labels(jnp.asarray(new), jnp.asarray(new[[3, 1, 0, 2]]))
  np.testing.assert_array_equal(np.asarray(labels), [2, 1, 3, 0])
  np.testing.assert_array_equal(np.asarray(clustering.match_labels(jnp.asarray(new), jnp.asarray(new))),
                                np.arange(4))


def test_cosine_bipartition_matches_reference():
  rng = np.random.default_rng(3)
  shift = np.eye(6)[0] * 5
  u = np.concatenate([rng.normal(size=(4, 6)) + shift, rng.normal(size=(3, 6)) - shift,
                      rng.normal(size=(2, 6))])
  sim = np.asarray(clustering.cosine_similarity_matrix(jnp.asarray(u, jnp.float32)))
  mask = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0], bool)
  got = np.asarray(clustering.cosine_bipartition(jnp.asarray(sim), jnp.asarray(mask)))
  np.testing.assert_array_equal(np.flatnonzero(got), [4, 5, 6])        # the obvious split
  for seed in range(4):   # random similarities: same groups as the plain loop
    v = np.random.default_rng(seed).normal(size=(7, 3))
    s = np.asarray(clustering.cosine_similarity_matrix(jnp.asarray(v, jnp.float32)))
    m = np.array([1, 0, 1, 1, 1, 1, 1], bool)
    got = np.flatnonzero(np.asarray(clustering.cosine_bipartition(jnp.asarray(s), jnp.asarray(m))))
    expected = ref.complete_linkage_bipartition(s.astype(np.float64), list(np.flatnonzero(m)))
    assert set(got.tolist()) == expected
  one = clustering.cosine_bipartition(jnp.asarray(sim), jnp.asarray(np.eye(9, dtype=bool)[0]))
  assert not np.asarray(one).any()


def test_sample_mean_draws_without_replacement_from_real_rows():
  x = jnp.arange(12.0).reshape(6, 2)
  np.testing.assert_allclose(clustering.sample_mean(jax.random.key(0), x, jnp.int32(4), 10), [3.0, 4.0])
  for seed in range(5):
    m = np.asarray(clustering.sample_mean(jax.random.key(seed), x, jnp.int32(4), 2))
    rows = np.asarray(x)[:4]
    pairs = [(rows[i] + rows[j]) / 2 for i in range(4) for j in range(i + 1, 4)]
    assert any(np.allclose(m, p) for p in pairs)


# ------------------------------------------------------------------ algorithms vs loops
def test_awcfl_matches_reference(problem):
  """Round 1 without clustering (FedAvg into every cluster), round 2 clustered and mixed
  (beta = 0, plain K-means clustered FL, is checked through MCFL below)."""
  p, k, beta = problem, 2, 0.3
  alg, traces = count_traces(awcfl(num_clusters=k, beta=beta, cluster_start_round=1, kmeans_iters=5,
                                   **p["kw"]))
  step = jax.jit(alg.round)
  state = alg.init(jax.random.key(0))
  params, cluster_of = _rows(state.params, k), np.zeros(6, np.int64)
  for r in (1, 2):
    key = jax.random.key(10 + r)
    state, _ = step(state, p["data"], key)
    params, cluster_of = ref.awcfl_round(
      p["model"], params, cluster_of, p["data"], key, r=r, beta=beta, start=1, iters=5, weights=p["weights"],
      lr=LR, batch_size=BATCH, num_steps=p["steps"])
    np.testing.assert_array_equal(np.asarray(state.cluster_of), cluster_of)
    close(state.params, ref.stack(params), tol=2e-5)
  assert len(set(cluster_of.tolist())) == 2
  assert len(traces) == 1   # one compile for the unclustered and the clustered round


def test_awcfl_one_cluster_beta0_is_fedavg(problem):
  p = problem
  a = awcfl(num_clusters=1, beta=0.0, cluster_start_round=0, **p["kw"])
  b = fedavg(**p["kw"])
  sa = loop.run(a, p["data"], num_rounds=3, key=jax.random.key(4))
  sb = loop.run(b, p["data"], num_rounds=3, key=jax.random.key(4))
  close(sa.params, sb.params[0], tol=2e-5)


def test_ifca_matches_reference_and_picks_min_loss(problem):
  p, k = problem, 3
  alg, traces = count_traces(ifca(num_clusters=k, **p["kw"]))
  step = jax.jit(alg.round)
  state = alg.init(jax.random.key(1))
  params = _rows(state.params, k)
  for r in (1, 2):
    key = jax.random.key(20 + r)
    state, _ = step(state, p["data"], key)
    params, picks, losses = ref.ifca_round(p["model"], params, p["data"], key, weights=p["weights"], lr=LR,
                                           batch_size=BATCH, num_steps=p["steps"])
    np.testing.assert_array_equal(np.asarray(state.cluster_of), picks)
    close(state.params, ref.stack(params), tol=2e-5)
  # the one sane model is picked by every client; the unpicked ones stay put
  fresh = alg.init(jax.random.key(2))
  start = jax.tree.map(lambda a: a.at[0].multiply(30.0).at[2].multiply(30.0), fresh.params)
  state, _ = step(fresh.replace(params=start), p["data"], jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(state.cluster_of), np.ones(6))
  assert len(traces) == 1
  close(ref.row(state.params, 0), ref.row(start, 0), tol=0)
  close(ref.row(state.params, 2), ref.row(start, 2), tol=0)


def test_cfl_matches_reference_and_splits_flipped_clients(problem):
  p, k = problem, 3
  alg, traces = count_traces(cfl(max_clusters=k, eps1=1e3, eps2=1e-4, **p["kw"]))   # split whenever possible
  step = jax.jit(alg.round)
  state = alg.init(jax.random.key(0))
  params, cluster_of, used = _rows(state.params, k), np.zeros(6, np.int64), 1
  for r in (1, 2):
    key = jax.random.key(30 + r)
    state, _ = step(state, p["data"], key)
    params, cluster_of, used = ref.cfl_round(p["model"], params, cluster_of, used, p["data"], key, eps1=1e3,
                                             eps2=1e-4, weights=p["weights"], lr=LR, batch_size=BATCH,
                                             num_steps=p["steps"])
    np.testing.assert_array_equal(np.asarray(state.cluster_of), cluster_of)
    assert int(state.num_clusters) == used == min(k, 2 ** r)
    close(state.params, ref.stack(params), tol=2e-5)
  # no split while the criterion is not met (same compiled round: eps are static, so a fresh
  # algorithm; one round suffices)
  never = cfl(max_clusters=k, eps1=1e-6, eps2=1e-4, **p["kw"])
  s, _ = jax.jit(never.round)(never.init(jax.random.key(0)), p["data"], jax.random.key(1))
  assert int(s.num_clusters) == 1 and not np.asarray(s.cluster_of).any()
  assert len(traces) == 1


def test_mcfl_is_awcfl_beta0_and_picks_the_nearest_cluster_feature(problem):
  """MCFL trains as AWCFL with beta = 0, i.e. plain K-means clustered FL: checked against the
  reference's per-cluster means; then its picks, and the intra/inter report."""
  p, k = problem, 2
  big = int(max(p["data"].max_train, p["data"].x_test.shape[1]))   # n >= every client: whole-data means
  alg, traces = count_traces(mcfl(num_clusters=k, cluster_start_round=1, kmeans_iters=5, feature_examples=big,
                              **p["kw"]))
  step = jax.jit(alg.round)
  state = alg.init(jax.random.key(5))
  params, cluster_of = _rows(state.params, k), np.zeros(6, np.int64)
  for r in (1, 2, 3):
    key = jax.random.key(50 + r)
    state, _ = step(state, p["data"], key)
    params, cluster_of = ref.awcfl_round(
      p["model"], params, cluster_of, p["data"], key, r=r, beta=0.0, start=1, iters=5, weights=p["weights"],
      lr=LR, batch_size=BATCH, num_steps=p["steps"])
    np.testing.assert_array_equal(np.asarray(state.cluster_of), cluster_of)
    close(state.params, ref.stack(params), tol=2e-5)
  assert len(traces) == 1 and len(set(cluster_of.tolist())) == 2
  cl = np.asarray(state.cluster_of)
  first = np.asarray(p["data"].x_train[0][: int(p["data"].n_train[0])]).reshape(-1, 16)
  np.testing.assert_allclose(np.asarray(state.features.client_mean)[0], first.mean(0), atol=1e-5)
  for metric in ("l1", "l2"):
    np.testing.assert_array_equal(np.asarray(select_clusters(state, metric)),
                                  ref.feature_choice(p["data"], cl, metric))
  models = alg.models(state)
  assert set(models) == {"cluster", "selected"} and models["selected"].chosen_by_data
  out = evaluation.evaluate_models(alg, state, p["model"], p["data"])
  for name in ("cluster", "selected"):
    assert 0.0 <= out[name]["intra_cluster_accuracy"] <= 1.0
    assert out[name]["num_clusters"] == len(set(cl.tolist()))
  # intra by hand: each client's own cluster model on its own test data
  stats = metrics.make_evaluator(p["model"])(state.params, p["data"].x_test, p["data"].y_test,
                                                p["data"].n_test, jnp.asarray(cl))
  assert out["cluster"]["intra_cluster_accuracy"] == pytest.approx(
    float(np.sum(stats.correct) / np.sum(stats.count)))


# ------------------------------------------------------------------ errors
def test_bad_configs_raise_naming_the_value(problem):
  kw = problem["kw"]
  for beta in (-0.1, 1.5):
    with pytest.raises(ValueError, match=f"beta={beta}"):
      awcfl(num_clusters=2, beta=beta, **kw)
  for build in (awcfl, mcfl, ifca):
    for k in (0, 7):
      with pytest.raises(ValueError, match=f"num_clusters={k}"):
        build(num_clusters=k, **kw)
  with pytest.raises(ValueError, match="max_clusters=7"):
    cfl(max_clusters=7, **kw)
  with pytest.raises(ValueError, match="metric='l3'"):
    mcfl(num_clusters=2, metric="l3", **kw)
  with pytest.raises(ValueError, match="init='kmeans'"):
    ifca(num_clusters=2, init="kmeans", **kw)
  with pytest.raises(ValueError, match="min_split_size=1"):
    cfl(max_clusters=2, min_split_size=1, **kw)


# ------------------------------------------------------------------ data and config
def test_transforms():
  data = prototype_images(num_clients=4, num_examples=60, image_size=5, alpha=10.0, seed=1)
  x = np.asarray(data.x_train)
  h = transform_clients(data, [1], "hflip")
  np.testing.assert_array_equal(np.asarray(h.x_train)[1], x[1][:, :, ::-1])
  np.testing.assert_array_equal(np.asarray(h.x_train)[0], x[0])
  rot = transform_clients(data, [2], "rot180")
  np.testing.assert_array_equal(np.asarray(rot.x_test)[2], np.asarray(data.x_test)[2][:, ::-1, ::-1])
  twice = transform_clients(transform_clients(data, [0, 3], "vflip"), [0, 3], "vflip")
  np.testing.assert_array_equal(np.asarray(twice.x_train), x)
  vec = data.replace(x_train=x.reshape(4, x.shape[1], -1), x_test=np.asarray(data.x_test).reshape(4, -1, 25))
  np.testing.assert_array_equal(np.asarray(transform_clients(vec, [0], "hflip").x_train)[0],
                                x.reshape(4, x.shape[1], -1)[0][:, ::-1])
  out, flags = transform_random_clients(data, num_transformed=2, kind="rot180", seed=3)
  assert flags.sum() == 2 and set(np.flatnonzero(flags)) <= {0, 1, 2, 3}
  with pytest.raises(ValueError, match="num_transformed=5"):
    transform_random_clients(data, num_transformed=5)
  with pytest.raises(ValueError, match="kind='rot90'"):
    transform_clients(data, [0], "rot90")


def _small_config(variant="synthetic"):
  c = load_config("clustered", variant)
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 4, 2, 2, False   # evaluates mid-run too
  if variant == "synthetic":
    c.data.num_examples, c.data.image_size = 300, 6
  c.model.hidden = (8,)
  for run in c.runs.values():
    if run.get("cluster_start_round", 0):      # IFCA-based runs keep 0
      run.cluster_start_round = 2
    if "split_start_round" in run:
      run.split_start_round = 2
  return c


def test_clustered_config_end_to_end(tmp_path):
  """Fast: the config's MCFL run (the others are covered above and by the slow test)."""
  c = _small_config()
  keep = ("mcfl",)
  c.runs = {k: v for k, v in c.runs.items() if k in keep}
  c.run_order = keep
  results = train_and_evaluate(c, str(tmp_path))
  assert set(results) == set(keep)
  assert set(results["mcfl"]) == {"cluster", "selected"}
  s = results["mcfl"]["selected"]
  assert 0.0 <= s["intra_cluster_accuracy"] <= 1.0 and s["num_clusters"] >= 1
  assert (tmp_path / "summary.json").exists()
  lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  assert [ln["round"] for ln in lines if ln["run"] == "mcfl"] == [2, 4]
  assert all("selected/inter_cluster_accuracy" in ln for ln in lines if ln["run"] == "mcfl")


def test_clustered_config_runs_the_papers_figures_and_tables():
  """Fig. 5/6 (CFL, AWCFL_CFL, MCFL_CFL), Figs. 7-8 (IFCA, AWCFL_IFCA, MCFL_IFCA), Table 2
  (FedAvg, CFL, AWCFL, MCFL) in the default; Table 1 (β) as a seeded sweep."""
  from fedtree.experiment.runner import validate_config

  for variant in ("synthetic", "digits", "mnist", "emnist"):
    c = load_config("clustered", variant)
    validate_config(c)
    assert c.run_order == ("fedavg", "cfl", "awcfl_cfl", "mcfl_cfl", "ifca", "awcfl_ifca", "mcfl_ifca",
                           "awcfl_b050", "mcfl")
    want = {"awcfl_cfl": ("awcfl", "cfl"), "mcfl_cfl": ("mcfl", "cfl"), "awcfl_ifca": ("awcfl", "ifca"),
            "mcfl_ifca": ("mcfl", "ifca"), "awcfl_b050": ("awcfl", "kmeans"), "mcfl": ("mcfl", "kmeans")}
    for label, (algorithm, how) in want.items():
      run = c.runs[label]
      assert (run.algorithm, run.get("clustering", "kmeans")) == (algorithm, how), label
    assert c.rounds // c.eval_every >= 15      # many points on the accuracy-over-rounds curves
    assert c.data.transform.num_transformed == c.data.num_clients // 2
  assert load_config("clustered", "digits").data.name == "sklearn_digits"
  sweep = load_config("clustered", "digits+beta_sweep")
  assert sweep.sweep.seeds > 1 and sweep.sweep.params == "runs.awcfl.beta=0,0.1,0.25,0.5,1"
  with pytest.raises(ValueError, match="variant='cifar'"):
    load_config("clustered", "cifar")


def test_clustered_digits_config_context():
  """The ``digits`` variant's data: the real digits over 10 clients, 5 of them flipped."""
  pytest.importorskip("sklearn")
  from fedtree.experiment.runner import make_context

  ctx = make_context(load_config("clustered", "digits"))
  assert ctx.data.num_clients == 10 and ctx.data.example_shape == (8, 8, 1)
  assert int(ctx.data.n_train.sum() + ctx.data.n_test.sum()) == 1797
  assert sorted(set(ctx.groups.tolist())) == [0, 1] and int(ctx.groups.sum()) == 5


@pytest.mark.slow
def test_clustered_digits_config_end_to_end(tmp_path):
  """The ``digits`` variant (real digits, 5 of 10 clients flipped), MCFL_IFCA only."""
  pytest.importorskip("sklearn")
  c = _small_config("digits")
  c.rounds, c.local.steps, c.data.alpha = 2, 2, 1.0     # less padding than alpha = 0.1
  c.runs = {"mcfl_ifca": c.runs.mcfl_ifca}
  c.run_order = ("mcfl_ifca",)
  s = train_and_evaluate(c, str(tmp_path))["mcfl_ifca"]["selected"]
  assert 0.0 <= s["inter_cluster_accuracy"] <= 1.0 and s["num_clusters"] == 2


@pytest.mark.slow
def test_clustered_figure_runs_draw_their_curves(tmp_path):
  """The Fig. 5 and Figs. 7-8 runs on digits: a cluster panel per run, curves at every evaluation."""
  pytest.importorskip("sklearn")
  pytest.importorskip("matplotlib")
  c = _small_config("digits")
  keep = ("cfl", "awcfl_cfl", "mcfl_cfl", "ifca", "awcfl_ifca", "mcfl_ifca")
  c.runs = {k: c.runs[k] for k in keep}
  c.run_order = keep
  results = train_and_evaluate(c, str(tmp_path))
  assert set(results) == set(keep)
  lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  for label in keep:
    rows = [ln for ln in lines if ln["run"] == label]
    assert [ln["round"] for ln in rows] == [2, 4]
    assert all("cluster/inter_cluster_accuracy" in ln for ln in rows)
  assert (tmp_path / "plot_clusters.png").exists()


@pytest.mark.slow
def test_clustered_config_all_runs_and_tfds_variant(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  results = train_and_evaluate(_small_config(), str(tmp_path / "all"))
  assert len(results) == 9
  assert "intra_cluster_accuracy" not in results["fedavg"]["global"]
  assert all(0.0 <= results[k]["cluster"]["intra_cluster_accuracy"] <= 1.0 for k in results if k != "fedavg")
  c = load_config("clustered", "mnist")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 2, 2, 2, False
  c.model = {"name": "mlp", "hidden": (8,)}
  c.runs = {"awcfl_b050": c.runs.awcfl_b050, "mcfl": c.runs.mcfl}
  c.run_order = ("awcfl_b050", "mcfl")
  for run in c.runs.values():
    run.cluster_start_round = 1
  with tfds.testing.mock_data(num_examples=120, policy=tfds.testing.MockPolicy.USE_CODE):
    results = train_and_evaluate(c, str(tmp_path / "mnist"))
  assert set(results["mcfl"]) == {"cluster", "selected"}


# ------------------------------------------------------------------ issue 14: composition, matching, ARI
def test_optimal_assignment_matches_scipy_and_beats_greedy():
  from scipy.optimize import linear_sum_assignment

  solve = jax.jit(clustering.optimal_assignment)
  for k, seed in ((2, 0), (3, 1), (5, 2), (7, 3), (9, 4)):   # 9 > EXACT_MATCH_MAX: the host callback
    cost = np.random.default_rng(seed).uniform(size=(k, k)).astype(np.float32)
    _, cols = linear_sum_assignment(cost)
    np.testing.assert_array_equal(np.asarray(solve(jnp.asarray(cost))), cols)
  # cost [[1, 17.3], [0, 10]]: greedy takes the 0 first and pays 0 + 17.3; the optimum 1 + 10
  new = np.array([[0.0], [1.0]])
  prev = np.array([[1.0], [1.0 + np.sqrt(10.0)]])
  assert np.asarray(clustering.greedy_match_labels(jnp.asarray(new), jnp.asarray(prev))).tolist() == [1, 0]
  got = np.asarray(clustering.match_labels(jnp.asarray(new), jnp.asarray(prev)))
  assert got.tolist() == [0, 1] == ref.optimal_match(new, prev).tolist()


def test_hungarian_matching_is_invariant_to_relabelling():
  rng = np.random.default_rng(5)
  for k in (3, 4, 8):
    prev = rng.normal(size=(k, 6))
    new = prev + 0.8 * rng.normal(size=(k, 6))   # noisy: greedy and optimal may differ
    labels = np.asarray(clustering.match_labels(jnp.asarray(new), jnp.asarray(prev)))
    np.testing.assert_array_equal(labels, ref.optimal_match(new, prev))
    perm = rng.permutation(k)
    # previous ids relabelled by perm: new centroid i keeps its partner, under its new id
    relabelled = np.asarray(clustering.match_labels(jnp.asarray(new), jnp.asarray(prev[np.argsort(perm)])))
    np.testing.assert_array_equal(relabelled, perm[labels])
    # new centroids shuffled: each keeps the same partner
    shuffled = np.asarray(clustering.match_labels(jnp.asarray(new[perm]), jnp.asarray(prev)))
    np.testing.assert_array_equal(shuffled, labels[perm])


def test_split_separation_check_by_hand():
  """Sattler's check: two opposite groups split; three directions 120 degrees apart do not."""
  def split(u, check=True):
    u = jnp.asarray(u, jnp.float32)
    s = u.shape[0]
    return split_clusters(u, jnp.ones(s), jnp.zeros(s, jnp.int32), jnp.ones(s, bool), jnp.int32(1),
                          max_clusters=2, eps1=10.0, eps2=0.1, min_split_size=2, allow=jnp.bool_(True),
                          similarity_check=check)

  parent, _, did, *_, cross = split([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.0], [-1.0, -0.1]])
  assert bool(did[0]) and np.asarray(parent).tolist() == [0, 0, 1, 1]
  assert float(cross[0]) == pytest.approx(-np.cos(0.1 - np.arctan(0.1)) * 0 - 0.995, abs=0.01)
  tri = [[1.0, 0.0], [np.cos(2.1), np.sin(2.1)], [np.cos(4.2), np.sin(4.2)]]
  # the halves: one vector, and two at 120 degrees whose mean has norm 1/2 and whose
  # deviations sin(60) = 0.87: gamma = 1.7 > sqrt((1 + 1/2) / 2) = 0.87 -> no split
  assert not bool(split(tri)[2][0])
  assert bool(split(tri, check=False)[2][0])


def test_cfl_with_similarity_check_matches_reference(problem):
  p, k = problem, 3
  alg = cfl(max_clusters=k, eps1=1e3, eps2=1e-4, similarity_check=True, **p["kw"])
  step = jax.jit(alg.round)
  state = alg.init(jax.random.key(0))
  params, cluster_of, used = _rows(state.params, k), np.zeros(6, np.int64), 1
  for r in (1, 2):
    key = jax.random.key(30 + r)
    state, _ = step(state, p["data"], key)
    params, cluster_of, used = ref.cfl_round(p["model"], params, cluster_of, used, p["data"], key, eps1=1e3,
                                             eps2=1e-4, weights=p["weights"], lr=LR, batch_size=BATCH,
                                             num_steps=p["steps"], similarity_check=True)
    np.testing.assert_array_equal(np.asarray(state.cluster_of), cluster_of)
    assert int(state.num_clusters) == used
    close(state.params, ref.stack(params), tol=2e-5)
  assert used > 1   # a split cluster's median from its own members


def test_awcfl_ifca_beta0_is_ifca_and_beta_mixes_ifca_clusters(problem):
  p, k, beta = problem, 3, 0.4
  key0 = jax.random.key(1)
  plain = ifca(num_clusters=k, **p["kw"])
  zero = awcfl(num_clusters=k, beta=0.0, clustering="ifca", **p["kw"])
  sp, sz = plain.init(key0), zero.init(key0)
  for r in (1, 2):
    sp, _ = jax.jit(plain.round)(sp, p["data"], jax.random.key(20 + r))
    sz, _ = jax.jit(zero.round)(sz, p["data"], jax.random.key(20 + r))
  np.testing.assert_array_equal(np.asarray(sz.cluster_of), np.asarray(sp.cluster_of))
  close(sz.params, sp.params, tol=0)
  # beta > 0: IFCA's per-cluster means, then Eq. (2) over the k clusters (reference loop)
  mixed = awcfl(num_clusters=k, beta=beta, clustering="ifca", **p["kw"])
  state = mixed.init(key0)
  params = _rows(state.params, k)
  key = jax.random.key(21)
  state, _ = jax.jit(mixed.round)(state, p["data"], key)
  means, picks, _ = ref.ifca_round(p["model"], params, p["data"], key, weights=p["weights"], lr=LR,
                                   batch_size=BATCH, num_steps=p["steps"])
  expected = []
  for j in range(k):
    others = jax.tree.map(lambda *a: sum(a) / (k - 1), *[means[i] for i in range(k) if i != j])
    expected.append(jax.tree.map(lambda o, m: beta * o + (1 - beta) * m, others, means[j]))
  np.testing.assert_array_equal(np.asarray(state.cluster_of), picks)
  close(state.params, ref.stack(expected), tol=2e-5)


def _separated_problem():
  """8 clients in two groups whose inputs differ by a large offset (true clusters known)."""
  data = prototype_images(num_clients=8, num_examples=240, num_classes=3, image_size=4, blobs=2,
                          noise=0.2, alpha=100.0, test_fraction=0.25, seed=1)
  truth = np.array([0, 1, 0, 1, 0, 1, 0, 1])
  shift = np.where(truth == 1, 0.5, 0.0)[:, None, None, None]
  x_train = np.asarray(data.x_train) + shift.reshape((-1,) + (1,) * (np.asarray(data.x_train).ndim - 1))
  x_test = np.asarray(data.x_test) + shift.reshape((-1,) + (1,) * (np.asarray(data.x_test).ndim - 1))
  y_train, y_test = np.asarray(data.y_train), np.asarray(data.y_test)
  y_train = np.where(truth[:, None] == 1, (y_train + 1) % 3, y_train)   # and their labels disagree
  y_test = np.where(truth[:, None] == 1, (y_test + 1) % 3, y_test)
  data = data.replace(x_train=x_train, x_test=x_test, y_train=y_train, y_test=y_test)
  return as_device(data), truth


def test_mcfl_cfl_picks_its_own_clusters_model_on_separated_data():
  data, truth = _separated_problem()
  model = build_model("mlp", example_shape=data.example_shape, num_classes=data.num_classes, hidden=(16,))
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(0.3),
            schedule=LocalSchedule(batch_size=8, steps=10))
  # the split separation check is tested by hand above; on these noisy updates it is (rightly)
  # conservative, so the test splits on the norm criterion alone
  alg = mcfl(num_clusters=2, clustering="cfl", cluster_start_round=2, eps1=1e3, eps2=1e-4,
             similarity_check=False, feature_examples=20, **kw)
  state = loop.run(alg, data, num_rounds=4, key=jax.random.key(0))
  cl = np.asarray(state.cluster_of)
  assert int(state.num_clusters) == 2
  assert metrics.adjusted_rand_index(truth, cl) == pytest.approx(1.0)   # CFL found the groups
  np.testing.assert_array_equal(np.asarray(select_clusters(state, "l2")), cl)
  out = evaluation.evaluate_models(alg, state, model, data, groups=truth)
  assert out["selected"]["adjusted_rand_index"] == pytest.approx(1.0)
  assert out["selected"]["inter_cluster_accuracy"] == pytest.approx(out["selected"]["intra_cluster_accuracy"])


def test_composed_runs_from_a_config(tmp_path):
  """``algorithm="awcfl"`` / ``"mcfl"`` with ``clustering="cfl"`` / ``"ifca"`` build and run."""
  c = _small_config()
  c.rounds, c.eval_every, c.rounds_per_call = 2, 2, 2
  c.runs = {
    "awcfl_ifca": dict(algorithm="awcfl", clustering="ifca", num_clusters=2, beta=0.5, weighting="uniform"),
    "mcfl_cfl": dict(algorithm="mcfl", clustering="cfl", num_clusters=3, cluster_start_round=1, eps1=1e3,
                     eps2=1e-4, weighting="uniform"),
  }
  c.run_order = ("awcfl_ifca", "mcfl_cfl")
  results = train_and_evaluate(c, str(tmp_path))
  assert set(results["mcfl_cfl"]) == {"cluster", "selected"}
  # inter-cluster accuracy is nan when every client picked one cluster (no other cluster to score)
  assert 0.0 <= results["awcfl_ifca"]["cluster"]["intra_cluster_accuracy"] <= 1.0
  assert "adjusted_rand_index" in results["mcfl_cfl"]["cluster"]   # the flipped clients are the truth


def test_composition_errors_name_the_value(problem):
  kw = problem["kw"]
  with pytest.raises(ValueError, match="clustering='spectral'"):
    awcfl(num_clusters=2, clustering="spectral", **kw)
  with pytest.raises(ValueError, match="cluster_start_round=3"):
    mcfl(num_clusters=2, clustering="ifca", cluster_start_round=3, **kw)
  with pytest.raises(ValueError, match="inter_cluster='both'"):
    cfl(max_clusters=2, inter_cluster="both", **kw)


# -------------------------------------------------------------- the update path within clusters (issue 55)
def _median_path():
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import robust

  return UpdatePath(aggregator=robust.median())


def test_a_robust_aggregator_runs_within_each_cluster_as_the_loops_do(problem):
  """IFCA (the clusters the clients pick), AWCFL (K-means after training, then β-mixing) and CFL
  (splits) with the coordinate-wise median of each cluster's members: the loops' median of the
  members' models, two rounds each, one compile."""
  p, path = problem, _median_path()
  alg, traces = count_traces(ifca(num_clusters=2, update_paths=path, **p["kw"]))
  step, state = jax.jit(alg.round), alg.init(jax.random.key(1))
  params = _rows(state.params, 2)
  for r in (1, 2):
    key = jax.random.key(40 + r)
    state, _ = step(state, p["data"], key)
    params, picks, _ = ref.ifca_round(p["model"], params, p["data"], key, weights=p["weights"], lr=LR,
                                      batch_size=BATCH, num_steps=p["steps"], combine=ref.median)
    np.testing.assert_array_equal(np.asarray(state.cluster_of), picks)
    close(state.params, ref.stack(params), tol=2e-5)
  assert len(traces) == 1

  alg = awcfl(num_clusters=2, beta=0.3, cluster_start_round=1, kmeans_iters=5, update_paths=path, **p["kw"])
  step, state = jax.jit(alg.round), alg.init(jax.random.key(0))
  params, cluster_of = _rows(state.params, 2), np.zeros(6, np.int64)
  for r in (1, 2):
    key = jax.random.key(50 + r)
    state, _ = step(state, p["data"], key)
    params, cluster_of = ref.awcfl_round(p["model"], params, cluster_of, p["data"], key, r=r, beta=0.3,
                                         start=1, iters=5, weights=p["weights"], lr=LR, batch_size=BATCH,
                                         num_steps=p["steps"], combine=ref.median)
    np.testing.assert_array_equal(np.asarray(state.cluster_of), cluster_of)
    close(state.params, ref.stack(params), tol=2e-5)

  alg = cfl(max_clusters=3, eps1=1e3, eps2=1e-4, similarity_check=False, update_paths=path, **p["kw"])
  step, state = jax.jit(alg.round), alg.init(jax.random.key(0))
  params, cluster_of, used = _rows(state.params, 3), np.zeros(6, np.int64), 1
  for r in (1, 2):
    key = jax.random.key(60 + r)
    state, _ = step(state, p["data"], key)
    params, cluster_of, used = ref.cfl_round(p["model"], params, cluster_of, used, p["data"], key, eps1=1e3,
                                             eps2=1e-4, weights=p["weights"], lr=LR, batch_size=BATCH,
                                             num_steps=p["steps"], combine=ref.median)
    np.testing.assert_array_equal(np.asarray(state.cluster_of), cluster_of)
    assert int(state.num_clusters) == used
    close(state.params, ref.stack(params), tol=2e-5)
  assert used > 1   # a split cluster's median from its own members


def test_the_mean_aggregator_and_no_noise_within_clusters_are_todays_runs(problem):
  """The path's aggregator taken per cluster reduces to today's mean of models: the blockwise mean
  (a robust aggregator's machinery with the mean's estimate) and central DP with no noise and an
  unreachable clip give today's IFCA."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import privacy as dp
  from fedtree.toolbox import robust

  p = dict(problem)
  kw = dict(p["kw"], weighting="uniform")
  plain = loop.run(ifca(num_clusters=2, **kw), p["data"], num_rounds=2, key=jax.random.key(3))
  for path in (UpdatePath(aggregator=robust.trimmed_mean(beta=0.0)),
               UpdatePath(client=dp.clip(1e9), node=dp.central(0.0, 1e9))):
    other = loop.run(ifca(num_clusters=2, update_paths=path, **kw), p["data"], num_rounds=2,
                     key=jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(other.cluster_of), np.asarray(plain.cluster_of))
    close(other.params, plain.params, tol=2e-5)


def test_central_noise_is_added_once_to_every_clusters_sum(problem):
  """IFCA with central DP: against the same run without noise, every picked cluster's model moves by
  its noise over its members' count, N(0, (2 z C)^2) per coordinate (the counted normalisation's
  std); the tolerance is 5 standard errors of a std estimated from D coordinates."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import privacy as dp

  p = problem
  kw = dict(p["kw"], weighting="uniform")
  z, c = 0.7, 0.5
  runs = {}
  for noise in (0.0, z):
    alg = ifca(num_clusters=2, update_paths=UpdatePath(client=dp.clip(c), node=dp.central(noise, c)), **kw)
    state = alg.init(jax.random.key(1))
    runs[noise], metrics_ = jax.jit(alg.round)(state, p["data"], jax.random.key(7))
  picks = np.asarray(runs[z].cluster_of)
  np.testing.assert_array_equal(picks, np.asarray(runs[0.0].cluster_of))
  for j in np.unique(picks):
    count = int((picks == j).sum())
    diff = ref.flat(ref.row(runs[z].params, j)) - ref.flat(ref.row(runs[0.0].params, j))
    std = np.std(diff * count) / (2 * z * c)
    assert abs(std - 1.0) < 5 / np.sqrt(2 * diff.size), (j, std, diff.size)
  assert float(metrics_["dp_noise_std"]) == pytest.approx(2 * z * c)


def test_ifca_with_a_compressed_downlink_picks_and_trains_from_what_it_received(problem):
  """Every client receives the clusters' models cast to float16 (the downlink), picks by its loss on
  them and trains from them; the clusters average the models sent back (the loop's), and each
  client's downlink is the k models at 2 bytes a coordinate."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import compression

  p = problem
  path = UpdatePath(down=compression.downlink(compression.fp16()))
  alg = ifca(num_clusters=2, update_paths=path, **p["kw"])
  step, state = jax.jit(alg.round), alg.init(jax.random.key(1))
  params = _rows(state.params, 2)
  half = lambda m: jax.tree.map(lambda a: np.asarray(a, np.float16).astype(np.float32), m)   # noqa: E731
  for r in (1, 2):
    key = jax.random.key(70 + r)
    state, metrics_ = step(state, p["data"], key)
    params, picks, _ = ref.ifca_round(p["model"], params, p["data"], key, weights=p["weights"], lr=LR,
                                      batch_size=BATCH, num_steps=p["steps"], received=half)
    np.testing.assert_array_equal(np.asarray(state.cluster_of), picks)
    close(state.params, ref.stack(params), tol=2e-5)
  size = sum(np.size(a) for a in jax.tree.leaves(ref.row(state.params, 0)))
  assert int(metrics_["downlink_bytes"]) == 2 * 2 * size


def test_privacy_within_clusters_is_refused_where_the_clustering_reads_what_it_does_not_cover(problem):
  from fedtree.core.updates import UpdatePath, chain
  from fedtree.toolbox import privacy as dp

  kw = dict(problem["kw"], weighting="uniform")
  central = UpdatePath(client=dp.clip(0.5), node=dp.central(0.5, 0.5))
  local = UpdatePath(client=chain(dp.clip(0.5), dp.local_noise(0.5, 0.5)))
  with pytest.raises(ValueError, match=r"cfl: central differential privacy .* clustering='cfl': .* no "
                                       r"cluster's sum has a bounded sensitivity"):
    cfl(max_clusters=2, update_paths=central, **kw)
  with pytest.raises(ValueError, match=r"awcfl: central differential privacy .* clustering='kmeans'"):
    awcfl(num_clusters=2, update_paths=central, **kw)
  with pytest.raises(ValueError, match=r"ifca: local differential privacy .* reveals the pick"):
    ifca(num_clusters=2, update_paths=local, **kw)
  with pytest.raises(ValueError, match=r"mcfl: differential privacy .* feature means "
                                       r"\(feature_examples=10\)"):
    mcfl(num_clusters=2, clustering="ifca", update_paths=central, **kw)
  adaptive = dp.Adaptive(initial_clip=0.5, target_quantile=0.5, learning_rate=0.2, count_noise=0.5)
  with pytest.raises(ValueError, match=r"ifca: the node transform 'dp' keeps a state per cluster"):
    ifca(num_clusters=2, update_paths=UpdatePath(client=dp.clip(adaptive_node="dp"),
                                                 node=dp.central(0.5, adaptive=adaptive)), **kw)
  ifca(num_clusters=2, update_paths=central, **kw)   # IFCA: each client moves one cluster's sum
  cfl(max_clusters=2, update_paths=local, **kw)      # K-means and CFL read noised updates only


def test_the_robust_variant_attacks_every_run_but_one_and_builds_them():
  """``configs/clustered.py:robust`` (issue 55): FedAvg without the attack, FedAvg, IFCA and CFL under
  the sign flip with the mean and with the median; every run is resolved as the runner resolves it
  (its figures: the slow tests/test_config_figures.py)."""
  from fedtree.experiment import runner
  from fedtree.experiment.run import resolve

  c = runner.prepare_config(load_config("clustered", "robust"))
  runner.validate_config(c)
  attacked = [label for label, run in c.runs.items() if "attack" in run]
  assert sorted(attacked) == sorted(set(c.run_order) - {"fedavg"})
  assert {label for label, run in c.runs.items() if "aggregator" in run} == {
    "fedavg_flip_median", "ifca_flip_median", "cfl_flip_median"}
  c.data.num_examples = 300
  ctx = runner.make_context(c)
  for label in c.run_order:
    run = resolve(label, c.runs[label], ctx)
    assert run.block is None or run.block[1] >= run.block[2]   # a median's cohort blocks are counted
  with pytest.raises(ValueError, match="variant 'robst' after the data; choose one of"):
    load_config("clustered", "digits+robst")
