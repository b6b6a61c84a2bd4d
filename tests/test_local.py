"""fedtree.core.local: the local schedule, in-jit batching and shuffling, the persistent SGD update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.core.local import ClientData, LocalSchedule, batch_at
from fedtree.models import build_model


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
