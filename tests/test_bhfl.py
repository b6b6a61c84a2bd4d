"""B-HFL (paper 001): HierFAVG reduction, per-node reference loop, evaluation by level, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedtree.algorithms.bhfl import bhfl, level_table, proxy_from_clients
from fedtree.algorithms.hierfavg import hierfavg
from fedtree.asynchrony import Latency
from fedtree.data import as_device, from_client_arrays
from fedtree.local import LocalSchedule
from fedtree.models import build_model
from fedtree.topology import Topology

SIZES = [[3, 2], [2]]   # root -> 2 regions -> 3 edges -> 7 clients


def _data(num_clients, dim=4, classes=3, seed=0):
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in range(num_clients):
    n = int(rng.integers(4, 9))
    x = rng.normal(size=(n + 3, dim)).astype(np.float32) + c % 3
    y = rng.integers(0, classes, n + 3).astype(np.int32)
    train.append((x[:n], y[:n]))
    test.append((x[n:], y[n:]))
  return as_device(from_client_arrays(train, test, num_classes=classes))


def _setup():
  topo = Topology.from_sizes(SIZES)
  data = _data(topo.num_clients)
  model = build_model("mlp", example_shape=(4,), num_classes=3, hidden=(5,))
  return topo, data, model


def _close(a, b, tol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


@pytest.mark.parametrize("cohort", [None, [2, 1, 1]])
def test_reduces_to_hierfavg(cohort):
  topo, data, model = _setup()
  common = dict(model=model, topology=topo, data=data, local_optimizer=optax.sgd(0.1),
                schedule=LocalSchedule(batch_size=3, epochs=1.0), cohort_size=cohort)
  ref = hierfavg(periods=(3, 1), **common)
  alg = bhfl(periods=(3, 1, 1), up_optimizers=optax.sgd(1.0), down_optimizers=optax.sgd(1.0),
             **common)
  s_ref, s = ref.init(jax.random.key(0)), alg.init(jax.random.key(0))
  step_ref, step = jax.jit(ref.round), jax.jit(alg.round)
  for t in range(7):
    k = jax.random.fold_in(jax.random.key(1), t)
    s_ref, m_ref = step_ref(s_ref, data, k)
    s, m = step(s, data, k)
    for lv in range(topo.depth):
      _close(s.params[lv], s_ref.params[lv])
    np.testing.assert_allclose(m["train_loss"], m_ref["train_loss"], rtol=1e-5)
  # clients hold their edge's model after the full-replacement down phase
  _close(s.params[3], jax.tree.map(lambda p: p[topo.parent(3)], s.params[2]))
