"""Unit tests of fedtree.core.metrics: the vectorized evaluation against a loop, and the cluster
metrics (intra/inter-cluster accuracy, the adjusted Rand index) by hand and against the
reference loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_clustering as ref

from fedtree.core import metrics
from fedtree.core.metrics import evaluate, summarize
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model


def test_cluster_accuracy_by_hand():
  correct = np.array([[9, 1, 8, 0], [2, 7, 1, 6]], float)   # model k on client c
  count = np.full((2, 4), 10.0)
  out = metrics.cluster_accuracy(correct, count, np.array([0, 1, 0, 1]))
  assert out["intra_cluster_accuracy"] == pytest.approx((9 + 7 + 8 + 6) / 40)
  assert out["inter_cluster_accuracy"] == pytest.approx((1 + 0 + 2 + 1) / 40)
  assert out["num_clusters"] == 2
  chosen = metrics.cluster_accuracy(correct, count, np.array([0, 1, 0, 1]), np.array([0, 1, 0, 1]),
                                       chosen_by_data=True)
  assert chosen["inter_cluster_accuracy"] == pytest.approx(chosen["intra_cluster_accuracy"])
  assert np.isnan(metrics.cluster_accuracy(correct, count, np.zeros(4, int))["inter_cluster_accuracy"])


def test_adjusted_rand_index_by_hand():
  ari = metrics.adjusted_rand_index
  assert ari([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0)
  # [0,0,1,2] vs [0,0,1,1]: 6 pairs; same in a: {01}; same in b: {01, 23}; both: {01};
  # E = 1 * 2 / 6 = 1/3; ARI = (1 - 1/3) / (1.5 - 1/3) = 4/7
  assert ari([0, 0, 1, 2], [0, 0, 1, 1]) == pytest.approx(4 / 7)
  # [0,0,0,1,1,1] vs [0,0,1,1,2,2]: 15 pairs; a: 6; b: 3; both: 2 ({01}, {45});
  # E = 6 * 3 / 15 = 1.2; ARI = (2 - 1.2) / (4.5 - 1.2) = 0.8 / 3.3
  assert ari([0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]) == pytest.approx(0.8 / 3.3)
  assert ari([0, 0, 0], [5, 5, 5]) == 1.0
  rng = np.random.default_rng(0)
  for _ in range(3):
    a, b = rng.integers(0, 3, 12), rng.integers(0, 4, 12)
    assert ari(a, b) == pytest.approx(ref.adjusted_rand_index(a, b))
  with pytest.raises(ValueError, match="labels_pred has 2"):
    ari([0, 1, 1], [0, 1])


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
