"""Multi-label models (multi-hot labels, FLAIR): the sigmoid cross-entropy they train on and the metrics
pfl-research reports for FLAIR (macro and micro averaged precision, precision, recall), against plain
numpy and scikit-learn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.core.metrics import SCORE_BUCKETS, make_evaluator, multi_label_metrics, summarize
from fedtree.core.model import as_multi_label, masked_loss, masked_sigmoid_cross_entropy
from fedtree.datasets.prototypes import prototype_images
from fedtree.models import build_model

K = 5


def _bce(logits, labels):
  """Binary cross-entropy of sigmoid(logits), written out."""
  p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
  return -(labels * np.log(p) + (1 - labels) * np.log(1 - p))


def _model():
  return as_multi_label(build_model("logreg", example_shape=(3,), num_classes=K))


def test_the_loss_is_the_mean_binary_cross_entropy_over_labels_and_real_examples():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, K)).astype(np.float32) * 3
  labels = (rng.random((6, K)) < 0.4).astype(np.uint8)
  mask = np.asarray([True, True, False, True, True, False])
  want = _bce(logits, labels)[mask].mean()
  logits, labels = jnp.asarray(logits), jnp.asarray(labels)
  got = masked_sigmoid_cross_entropy(logits, labels, jnp.asarray(mask))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  assert float(masked_loss(_model(), logits, labels, jnp.asarray(mask))) == float(got)
  assert float(masked_sigmoid_cross_entropy(logits, labels, jnp.zeros(6, bool))) == 0.0


def _scored(rng, clients=3, rows=40):
  """A multi-label model's evaluation of random clients: ``(stats, scores [N, K], labels [N, K])`` of
  the real rows."""
  model = _model()
  params = model.init(jax.random.key(1))
  params = jax.tree.map(lambda a: 3.0 * jax.random.normal(jax.random.key(2), a.shape)[None], params)
  x = rng.normal(size=(clients, rows, 3)).astype(np.float32)
  y = (rng.random((clients, rows, K)) < 0.3).astype(np.uint8)
  n = np.asarray([rows, rows // 2, 7], np.int32)[:clients]
  stats = make_evaluator(model, chunk_size=2)(params, x, y, n, np.zeros(clients, np.int32))
  logits = np.concatenate([np.asarray(model.apply(jax.tree.map(lambda a: a[0], params), x[c, :n[c]]))
                           for c in range(clients)])
  labels = np.concatenate([y[c, :n[c]] for c in range(clients)])
  return stats, logits, labels


def test_loss_accuracy_precision_recall_equal_a_plain_reference():
  stats, logits, labels = _scored(np.random.default_rng(0))
  s = summarize(stats)
  np.testing.assert_allclose(s["loss"], _bce(logits, labels).mean(), rtol=1e-5)
  pred = logits >= 0
  assert s["accuracy"] == pytest.approx(np.mean(pred == (labels > 0)), abs=1e-6)
  tp, fp, fn = ((pred & (labels > 0)).sum(0), (pred & (labels == 0)).sum(0), (~pred & (labels > 0)).sum(0))
  with np.errstate(invalid="ignore"):
    assert s["macro_precision"] == pytest.approx(np.mean(np.nan_to_num(tp / (tp + fp))))
    assert s["macro_recall"] == pytest.approx(np.mean(np.nan_to_num(tp / (tp + fn))))
  assert s["micro_precision"] == pytest.approx(tp.sum() / (tp.sum() + fp.sum()))
  assert s["micro_recall"] == pytest.approx(tp.sum() / (tp.sum() + fn.sum()))
  assert np.asarray(stats.label_scores).shape == (3, 2, SCORE_BUCKETS, K)


def _average_precision(labels, scores):
  """Averaged precision by hand (scikit-learn's definition): over the distinct scores ``t`` from the
  highest down, the precision at ``score >= t`` weighted by the recall it adds."""
  ap, previous = 0.0, 0.0
  for t in np.unique(scores)[::-1]:
    hit = scores >= t
    recall = (hit & (labels > 0)).sum() / max((labels > 0).sum(), 1)
    ap += (recall - previous) * (hit & (labels > 0)).sum() / hit.sum()
    previous = recall
  return ap


def test_averaged_precision_equals_the_reference_on_bucketed_scores():
  stats, logits, labels = _scored(np.random.default_rng(1))
  s = summarize(stats)
  bucketed = np.floor(np.asarray(jax.nn.sigmoid(jnp.asarray(logits))) * SCORE_BUCKETS)
  per_label = [_average_precision(labels[:, k], bucketed[:, k]) for k in range(K)]
  assert s["macro_ap"] == pytest.approx(np.mean(per_label), abs=1e-9)
  assert s["micro_ap"] == pytest.approx(_average_precision(labels.ravel(), bucketed.ravel()), abs=1e-9)
  sklearn = pytest.importorskip("sklearn.metrics")
  assert s["macro_ap"] == pytest.approx(sklearn.average_precision_score(labels, bucketed, average="macro"))
  assert s["micro_ap"] == pytest.approx(sklearn.average_precision_score(labels, bucketed, average="micro"))
  raw = sklearn.average_precision_score(labels, np.asarray(jax.nn.sigmoid(jnp.asarray(logits))))
  assert abs(s["macro_ap"] - raw) < 0.05   # the buckets' ties only (87 rows, scores near 0 and 1)


def test_a_label_without_positives_counts_zero_as_pfl_research_counts_it():
  h = np.zeros((2, SCORE_BUCKETS, 2))
  h[1, 150, 0] = 3    # label 0: three positives scored 0.75
  h[0, 20, 1] = 4     # label 1: no positive
  m = multi_label_metrics(h)
  assert m["macro_ap"] == 0.5 and m["micro_ap"] == 1.0
  assert (m["macro_precision"], m["macro_recall"], m["micro_precision"]) == (0.5, 0.5, 1.0)


def test_counts_that_need_one_class_are_refused():
  with pytest.raises(ValueError, match="multi-label model .* no single class per example, so no top_k"):
    make_evaluator(_model(), top_k=3)
  lm = build_model("lstm_lm", example_shape=(8,), num_classes=20, hidden=4, layers=1)
  with pytest.raises(ValueError, match=r"label_shape=\(8,\) \(a sequence model\)"):
    as_multi_label(lm)
  assert _model().label_shape == (K,) and not _model().token_labels and lm.token_labels


def test_methods_of_one_class_per_example_refuse_a_multi_label_model_by_name():
  import optax

  from fedtree.objectives.alo import alo_update
  from fedtree.objectives.fedmmd import check_features

  with pytest.raises(ValueError, match=r"ALO .* labels are multi-hot \(a multi-label model\)"):
    alo_update(_model(), optax.sgd(0.1), mu=0.1, lam=0.1, batch_size=2, max_steps=1)
  with pytest.raises(ValueError, match=r"shape \(5,\) \(multi-hot \(a multi-label model\)\)"):
    check_features(_model(), (3,), "FedMMD")


def test_generated_multi_label_images():
  data = prototype_images(num_clients=4, num_examples=80, num_classes=6, max_labels=3, seed=0)
  y = np.asarray(data.y_train)[np.arange(data.y_train.shape[1])[None] < np.asarray(data.n_train)[:, None]]
  assert y.shape[-1] == 6 and set(np.unique(y)) <= {0, 1}
  assert y.sum(-1).min() >= 1 and y.sum(-1).max() == 3
  with pytest.raises(ValueError, match="max_labels=7 must be None or between 1 and num_classes=6"):
    prototype_images(num_classes=6, max_labels=7)


def test_fine_tuning_and_per_client_losses_score_a_multi_label_model():
  from fedtree.algorithms.clustering.clustered import cluster_losses
  from fedtree.core.finetune import finetune_evaluate
  from fedtree.core.local import LocalSchedule

  data = prototype_images(num_clients=3, num_examples=60, num_classes=K, image_size=4, max_labels=2,
                          partition="iid", seed=0)
  model = as_multi_label(build_model("logreg", example_shape=data.example_shape, num_classes=K))
  params = jax.tree.map(lambda a: a[None], model.init(jax.random.key(0)))
  stats, _ = finetune_evaluate(model, params, np.zeros(3, np.int32), data, learning_rates=[0.1, 0.5],
                               schedule=LocalSchedule(batch_size=4, epochs=1), key=jax.random.key(1))
  assert np.asarray(stats.label_scores).shape == (2, 3, 2, SCORE_BUCKETS, K)
  per_rate = summarize(jax.tree.map(lambda a: a[0], stats))
  assert 0.0 <= per_rate["macro_ap"] <= 1.0 and np.isfinite(per_rate["loss"])
  losses = cluster_losses(model, params, data.x_test, data.y_test, data.n_test)
  assert losses.shape == (3, 1) and np.all(np.isfinite(np.asarray(losses)))
