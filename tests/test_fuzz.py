"""Property-based fuzzing (issue 15): random trees of depth 1-3, partitions with one-client
groups and one-example clients, cohorts, chunks, periods and batch sizes, for FedAvg, HierFAVG,
FedProx, Ditto, pFedMe, B-HFL, IFCA and AWCFL. Every problem either runs with a finite state of
the right shapes or is refused with a ``ValueError`` naming the bad value; never a crash or a
silent wrong shape.

The default run tries 24 problems of four algorithms (:data:`QUICK`) in four compiles: the
tree, cohort, chunk and step count are fixed per algorithm and the data (seed, client sizes
down to one example, padded to one shape) vary, so each algorithm is built and compiled once
and its compiled rounds run every problem of its shape (a factory reads only the tree and the
data's shapes). ``-m slow`` runs 1,000 problems of all eight algorithms whose structure varies
too (one compile per structure)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedtree import algorithms
from fedtree.core import loop
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model

ALGORITHMS = ("fedavg", "hierfavg", "fedprox", "ditto", "pfedme", "bhfl", "ifca", "awcfl")
QUICK = ("hierfavg", "pfedme", "bhfl", "ifca")
"""The default run's algorithms, one per family (a tree, a personalized objective, buffered
tiers, clusters): each compiles for ~5 s of CPU, the budget of the default run."""
FLAT = ("fedavg", "ifca", "awcfl")  # no tree: clients under one server
MAX_EXAMPLES = 5


@st.composite
def problems(draw, vary_structure: bool = True):
  """A problem; without ``vary_structure`` only the algorithm (of :data:`QUICK`) and the data
  values vary."""
  algorithm = draw(st.sampled_from(ALGORITHMS if vary_structure else QUICK))
  data = dict(min_examples=draw(st.integers(1, 3)), seed=draw(st.integers(0, 3)))
  if not vary_structure:
    return dict(algorithm=algorithm, groups=(2, 1), depth=2, cohort=None, chunk=None, period=1,
                batch=2, steps=2, **data)
  return dict(
    algorithm=algorithm,
    groups=tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))),
    depth=draw(st.sampled_from([1, 2, 3])),
    cohort=draw(st.one_of(st.none(), st.integers(0, 4))),
    chunk=draw(st.one_of(st.none(), st.integers(0, 3))),
    period=draw(st.integers(0, 3)),
    batch=draw(st.integers(1, 4)),
    steps=draw(st.one_of(st.none(), st.integers(1, 2))),   # None: one epoch
    **data,
  )


def _topology(groups, depth):
  if depth == 1:
    return Topology.flat(sum(groups))
  if depth == 2:
    return Topology.from_sizes(list(groups))
  return Topology.from_sizes([list(groups), [1]])   # an extra subtree of one client


def _data(p):
  sizes = list(p["groups"]) + ([1] if p["depth"] == 3 else [])
  data, _ = grouped_synthetic(group_sizes=tuple(sizes), dim=3, num_classes=2, mean_examples=3,
                              min_examples=p["min_examples"], max_examples=MAX_EXAMPLES,
                              test_examples=2, seed=p["seed"])
  data = as_device(data)
  pad = MAX_EXAMPLES - data.x_train.shape[1]  # one shape whatever the sizes drawn
  return data.replace(x_train=jnp.pad(data.x_train, ((0, 0), (0, pad), (0, 0))),
                      y_train=jnp.pad(data.y_train, ((0, 0), (0, pad))))


_BUILT: dict = {}


def _build(algorithm, groups, depth, cohort, chunk, period, batch, steps, data):
  """The algorithm of a structure, built once per structure and data shape: problems of one
  structure share it and hence its compiled rounds (loop.COMPILED is keyed by the algorithm)."""
  key = (algorithm, groups, depth, cohort, chunk, period, batch, steps, data.x_train.shape)
  if key in _BUILT:
    return _BUILT[key]
  topo = _topology(groups, depth)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=2, hidden=(3,))
  schedule = LocalSchedule(batch_size=batch, epochs=None if steps else 1, steps=steps)
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=schedule,
            cohort_size=cohort, chunk_size=chunk)
  tree = dict(topology=topo, periods=period if topo.depth > 1 else None)
  extra = {
    "fedavg": {}, "hierfavg": tree, "fedprox": dict(mu=0.1, **tree), "ditto": dict(lam=0.1, **tree),
    "pfedme": dict(lam=15.0, inner_steps=2, personal_lr=0.05, learning_rate=0.1, **tree),
    "bhfl": dict(topology=topo, down_optimizers=optax.sgd(0.5)),
    "ifca": dict(num_clusters=2), "awcfl": dict(num_clusters=2, cluster_start_round=1, kmeans_iters=2),
  }[algorithm]
  _BUILT[key] = getattr(algorithms, algorithm)(**kw, **extra)
  return _BUILT[key]


def _check(p):
  data = _data(p)
  n = data.num_clients
  structure = tuple(p[k] for k in ("algorithm", "groups", "depth", "cohort", "chunk", "period",
                                   "batch", "steps"))
  try:
    alg = _build(*structure, data)
  except ValueError as e:
    assert "=" in str(e), f"a refusal must name the bad value: {e}"
    return
  state = loop.run(alg, data, num_rounds=2, key=jax.random.key(p["seed"]), rounds_per_call=2)
  assert int(state.round) == 2
  for name, nm in alg.models(state).items():
    for leaf in jax.tree.leaves(nm.params):
      assert np.isfinite(np.asarray(leaf)).all(), name
    rows = jax.tree.leaves(nm.params)[0].shape[0]
    owner = np.asarray(nm.model_of_client)
    assert owner.shape == (n,) and 0 <= owner.min() and owner.max() < rows, name


def fuzz(max_examples: int) -> settings:
  return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])


@fuzz(24)
@given(problems(vary_structure=False))
def test_fuzz_small(p):
  _check(p)


@pytest.mark.slow
@fuzz(1000)
@given(problems())
def test_fuzz_1000(p):
  _check(p)
