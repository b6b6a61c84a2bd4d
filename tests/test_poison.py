"""Data poisoning (fedtree.datasets.poison): label flipping and a backdoor on the attackers' stored
examples only (padded and ragged layouts agree), against a per-client loop; the attack success
rate of a model that obeys the trigger and of one that ignores it."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.core.ragged import to_padded_train, to_ragged_train
from fedtree.datasets import poison
from fedtree.datasets.synthetic import grouped_synthetic

MASK = np.array([True, False, False, True, False])


@pytest.fixture(scope="module")
def data():
  d, _ = grouped_synthetic(group_sizes=(3, 2), dim=6, num_classes=3, mean_examples=8,
                           min_examples=3, max_examples=11, test_examples=6, seed=1)
  return d


def test_flip_labels_by_permutation_and_target(data):
  perm = [2, 0, 1]
  out = poison.flip_labels(data, MASK, permutation=perm)
  y, yo, n = np.asarray(data.y_train), np.asarray(out.y_train), np.asarray(data.n_train)
  for c in range(5):
    for i in range(y.shape[1]):
      want = perm[y[c, i]] if MASK[c] and i < n[c] else y[c, i]
      assert yo[c, i] == want
  np.testing.assert_array_equal(np.asarray(out.x_train), np.asarray(data.x_train))
  tgt = np.asarray(poison.flip_labels(data, MASK, target=1).y_train)
  assert np.all(tgt[0, :n[0]] == 1) and np.array_equal(tgt[1], y[1])


def test_backdoor_stamps_a_fraction_of_the_attackers_examples(data):
  trig = poison.Trigger(features=(0, 5), value=(9.0, -9.0))
  out = poison.add_backdoor(data, MASK, trigger=trig, target=2, fraction=0.5, seed=3)
  x, xo = np.asarray(data.x_train), np.asarray(out.x_train)
  y, yo, n = np.asarray(data.y_train), np.asarray(out.y_train), np.asarray(data.n_train)
  for c in range(5):
    changed = np.flatnonzero(np.any(x[c] != xo[c], axis=-1))
    if not MASK[c]:
      assert changed.size == 0 and np.array_equal(y[c], yo[c])
      continue
    assert changed.size == int(np.ceil(0.5 * n[c])) and changed.max() < n[c]
    np.testing.assert_array_equal(xo[c, changed][:, [0, 5]], np.tile([9.0, -9.0], (changed.size, 1)))
    np.testing.assert_array_equal(xo[c, changed][:, 1:5], x[c, changed][:, 1:5])
    assert np.all(yo[c, changed] == 2)
    rest = np.setdiff1d(np.arange(y.shape[1]), changed)
    np.testing.assert_array_equal(yo[c, rest], y[c, rest])
  # the ragged layout poisons the same examples
  rag = poison.add_backdoor(to_ragged_train(data), MASK, trigger=trig, target=2, fraction=0.5, seed=3)
  back = to_padded_train(rag)
  np.testing.assert_array_equal(np.asarray(back.x_train), xo)
  np.testing.assert_array_equal(np.asarray(back.y_train), yo)


def test_attack_success_rate(data):
  trig = poison.Trigger(features=(3,), value=100.0)

  def obeys(params, x):        # predicts the target (1) iff the trigger feature is set
    return jnp.stack([jnp.zeros(x.shape[0]), (x[:, 3] > 50) * 1.0, jnp.full(x.shape[0], 0.5)], -1)

  def ignores(params, x):
    return jnp.stack([jnp.ones(x.shape[0]), jnp.zeros(x.shape[0]), jnp.zeros(x.shape[0])], -1)

  assert float(poison.attack_success_rate(obeys, None, data, trigger=trig, target=1)) == 1.0
  assert float(poison.attack_success_rate(ignores, None, data, trigger=trig, target=1)) == 0.0
  _, keep = poison.triggered(data.x_test, data.y_test, data.n_test, trigger=trig, target=1)
  y, n = np.asarray(data.y_test), np.asarray(data.n_test)
  assert keep.sum() == sum(int(np.sum(y[c, :n[c]] != 1)) for c in range(5))


def test_bad_poisoning_is_refused(data):
  with pytest.raises(ValueError, match="give one of permutation= and target="):
    poison.flip_labels(data, MASK)
  with pytest.raises(ValueError, match=r"permutation=\[0, 0, 1\] is not a permutation of range\(3\)"):
    poison.flip_labels(data, MASK, permutation=[0, 0, 1])
  with pytest.raises(ValueError, match=r"target=3 must be a class in \[0, 3\)"):
    poison.flip_labels(data, MASK, target=3)
  with pytest.raises(ValueError, match="mask has shape"):
    poison.flip_labels(data, MASK[:3], target=1)
  with pytest.raises(ValueError, match=r"fraction=0.0 must be in \(0, 1\]"):
    poison.add_backdoor(data, MASK, trigger=poison.Trigger((0,), 1.0), target=1, fraction=0.0)
  with pytest.raises(ValueError, match=r"trigger indices must lie in \[0, 6\)"):
    poison.add_backdoor(data, MASK, trigger=poison.Trigger((6,), 1.0), target=1)
  with pytest.raises(ValueError, match="is not an image"):
    poison.corner_trigger((6,))
  assert len(poison.corner_trigger((8, 8, 1), size=2).features) == 4
