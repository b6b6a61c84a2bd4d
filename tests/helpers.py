"""Test helpers shared by several test files (import as ``from helpers import ...``; the tests
directory is on ``sys.path`` under pytest's default rootdir-relative imports)."""

import jax
import numpy as np


def close(a, b, tol=1e-5):
  """Every leaf of ``a`` within ``tol`` (absolute and relative) of ``b``'s (compared in float64)."""
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=tol, atol=tol)


def trees_equal(a, b):
  """``a`` and ``b`` have the same structure and bitwise equal leaves."""
  assert jax.tree.structure(a) == jax.tree.structure(b), (jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def np_grad(kernel, bias, x, y):
  """Gradient of the mean softmax cross-entropy of ``x @ kernel + bias``, by hand (numpy)."""
  z = x @ kernel + bias
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return x.T @ p / len(y), p.mean(0)


def row(tree, *idx):
  """Row ``idx`` of every leaf of a stacked ``tree``."""
  return jax.tree.map(lambda a: a[idx], tree)


def count_traces(alg):
  """``(alg with a counting round, traces)``: ``len(traces)`` is how often ``round`` was traced."""
  traces = []
  counted = alg._replace(round=lambda s, d, k: (traces.append(1), alg.round(s, d, k))[1])
  return counted, traces


def host_copy(tree):
  """``tree`` through host memory and back (what a checkpoint round trip does to a state)."""
  return jax.tree.map(lambda a: jax.device_put(np.asarray(a)) if not _is_key(a) else a, tree)


def _is_key(a) -> bool:
  return isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)


def client_data(data, c):
  """Client ``c``'s training split of ``data`` as one ``ClientData`` (a reference loop's input)."""
  from fedtree.core.local import ClientData

  return ClientData(data.x_train[c], data.y_train[c], data.n_train[c])


def one_server_tier(update, data, start, key, schedule, client_state=()):
  """``train_cohort`` of every client of ``data`` from one server's model ``start``, weighted by
  examples, keeping every slot's trained model (slots in the order of the sampler's clients)."""
  import jax.numpy as jnp

  from fedtree.core.sampling import cohort_sampler
  from fedtree.core.tier import train_cohort

  sampler = cohort_sampler(np.zeros(data.num_clients, np.int32), None)
  return train_cohort(update, jax.tree.map(lambda a: a[None], start), sampler(key), data,
                      num_steps=schedule.num_steps(data.n_train),
                      weights=data.n_train.astype(jnp.float32), key=key,
                      client_state=client_state, keep_client_params=True)
