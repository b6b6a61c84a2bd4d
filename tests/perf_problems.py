"""Tiny federated problems shared by the performance tests (chunking, sharding, precision)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms import fedavg, hierfavg
from fedtree.core.data import FederatedData, as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.loop import compile_rounds
from fedtree.core.topology import Topology
from fedtree.models import build_model


def tiny_data(num_clients: int = 10, max_examples: int = 12, dim: int = 6, seed: int = 0,
              equal: bool = False) -> FederatedData:
  """Clients with 3..max_examples examples (NaN padding, so any use of padding shows)."""
  rng = np.random.default_rng(seed)
  n = (np.full(num_clients, max_examples) if equal
       else rng.integers(3, max_examples + 1, num_clients))
  x = rng.normal(size=(num_clients, max_examples, dim)).astype(np.float32)
  y = rng.integers(0, 3, (num_clients, max_examples)).astype(np.int32)
  pad = np.arange(max_examples)[None, :] >= n[:, None]
  x[pad] = np.nan
  return as_device(FederatedData(
    x_train=x, y_train=y, n_train=n.astype(np.int32), x_test=x[:, :2], y_test=y[:, :2],
    n_test=np.minimum(n, 2).astype(np.int32), num_classes=3,
  ))


def tiny_model(dim: int = 6):
  return build_model("mlp", example_shape=(dim,), num_classes=3, hidden=(8,))


def run_rounds(alg, data, rounds: int = 3, seed: int = 0):
  """Final state after ``rounds`` rounds (one fused call) and the per-round metrics."""
  step = compile_rounds(alg, rounds)
  state = alg.init(jax.random.key(seed))
  return step(state, data, jax.random.key(seed + 1))


def make_fedavg(data, *, chunk_size=None, cohort_size=None, steps=None, compute_dtype=None,
                lr: float = 0.1, update_paths=None):
  from fedtree.core.local import sgd_client_update

  model = tiny_model(data.x_train.shape[-1])
  schedule = LocalSchedule(batch_size=4, epochs=None if steps else 1.0, steps=steps)
  update = None
  if compute_dtype is not None:
    update = sgd_client_update(model, optax.sgd(lr), batch_size=4,
                               max_steps=schedule.max_steps(data.max_train),
                               compute_dtype=compute_dtype)
  return fedavg(model=model, data=data, local_optimizer=optax.sgd(lr), schedule=schedule,
                chunk_size=chunk_size, cohort_size=cohort_size, client_update=update,
                update_paths=update_paths)


def make_hierfavg(data, sizes, *, chunk_size=None, cohort_size=None):
  model = tiny_model(data.x_train.shape[-1])
  return hierfavg(model=model, topology=Topology.from_sizes(sizes), data=data,
                  local_optimizer=optax.sgd(0.1),
                  schedule=LocalSchedule(batch_size=4, epochs=1.0),
                  chunk_size=chunk_size, cohort_size=cohort_size, periods=2)


def flat_params(state) -> np.ndarray:
  leaves = jax.tree.leaves(state.params)
  return np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in leaves])


def as_f32(tree):
  return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)


def dp_path(noise_multiplier: float = 1.0, clip_norm: float = 0.5):
  """Central DP at the clients' parents: every update clipped to ``clip_norm``, Gaussian noise
  of multiplier ``noise_multiplier`` added once to each parent's sum (counted normalisation)."""
  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import privacy

  return UpdatePath(client=privacy.clip(clip_norm), node=privacy.central(noise_multiplier, clip_norm))


def secagg_path(cohort: int = 12):
  """SecAgg's numerics at the clients' parents: Flower's defaults (clip range 8, 2^22 levels, a 32-bit
  field, stochastic rounding), the sum modulo 2^32 and the recovery against a threshold of 0.5."""
  import numpy as np

  from fedtree.core.updates import UpdatePath
  from fedtree.toolbox import secagg

  enc = secagg.fixed_point()
  return UpdatePath(client=secagg.client(enc), aggregator=secagg.secure_sum(enc),
                    node=secagg.recovery(cohort=np.array([cohort]), threshold=0.5))


def stream_scaffold(directory: str, mesh=None) -> tuple[np.ndarray, np.ndarray]:
  """SCAFFOLD streamed from a store written into ``directory`` (16 clients in two groups, cohort 4, two
  rounds a call, five rounds) on one device or over ``mesh`` (call under ``jax.set_mesh``): its final
  model and every client's paged control variate, flat."""
  import os

  from fedtree.algorithms import scaffold
  from fedtree.core import loop
  from fedtree.core.sharding import shard_data
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.population import PagedState, open_store, write_federated_data
  from fedtree.population.stream import paged_init, run, skeleton

  data, groups = grouped_synthetic(group_sizes=(8, 8), dim=6, num_classes=3, seed=2)
  path = os.path.join(directory, "store")
  store = open_store(path) if os.path.isdir(path) else write_federated_data(path, data, source={"name": "g"})
  skel = skeleton(store, width=int(data.x_train.shape[1]))
  alg = scaffold(model=tiny_model(), data=skel, local_optimizer=optax.sgd(0.1), local_learning_rate=0.1,
                 topology=Topology.from_labels(groups), cohort_size=4,
                 schedule=LocalSchedule(batch_size=4, steps=2, batch_order="cyclic"))
  key = jax.random.key(4)
  others, rows_of = paged_init(alg, loop.init_key(key), skel.num_clients)
  paged = PagedState(rows_of, skel.num_clients)
  state, _ = run(alg, skel if mesh is None else shard_data(skel, mesh), store, num_rounds=5, key=key,
                 paged=paged, others=others, rounds_per_call=2, mesh=mesh)
  rows = jax.tree.leaves(paged.gather(np.arange(skel.num_clients)))
  return flat_params(state), np.concatenate([np.ravel(a) for a in rows])
