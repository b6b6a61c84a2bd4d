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
