"""Property-based fuzzing (issue 15): random trees of depth 1-3, partitions with one-client
groups and one-example clients, cohorts, chunks, periods and batch sizes, for FedAvg and
HierFAVG. Every problem either runs with a finite state of the right shapes or is refused
with a ``ValueError`` naming the bad value; never a crash or a silent wrong shape.

The default run tries 4 problems (each compiles: a few seconds); ``-m slow`` runs 1,000."""

import jax
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedtree.algorithms.hierfavg import fedavg, hierfavg
from fedtree.core import loop
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model


@st.composite
def problems(draw):
  groups = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
  depth = draw(st.sampled_from([1, 2, 3]))
  return dict(
    groups=tuple(groups), depth=depth,
    algorithm=draw(st.sampled_from(["fedavg", "hierfavg"])),
    cohort=draw(st.one_of(st.none(), st.integers(0, 4))),
    chunk=draw(st.one_of(st.none(), st.integers(0, 3))),
    period=draw(st.integers(0, 3)),
    batch=draw(st.integers(1, 4)),
    min_examples=draw(st.integers(1, 3)),
  )


def _topology(groups, depth):
  if depth == 1:
    return Topology.flat(sum(groups))
  if depth == 2:
    return Topology.from_sizes(list(groups))
  return Topology.from_sizes([list(groups), [1]])   # an extra subtree of one client


def _check(p):
  topo = _topology(p["groups"], p["depth"])
  n = topo.num_clients
  sizes = list(p["groups"]) + ([1] if p["depth"] == 3 else [])
  data, _ = grouped_synthetic(group_sizes=tuple(sizes), dim=3, num_classes=2, mean_examples=3,
                              min_examples=p["min_examples"], max_examples=5, test_examples=2,
                              seed=0)
  assert data.num_clients == n
  model = build_model("mlp", example_shape=data.example_shape, num_classes=2, hidden=(3,))
  kw = dict(model=model, data=data, local_optimizer=optax.sgd(0.1),
            schedule=LocalSchedule(batch_size=p["batch"], epochs=1), cohort_size=p["cohort"],
            chunk_size=p["chunk"])
  try:
    if p["algorithm"] == "fedavg":
      alg = fedavg(**kw)
    else:
      alg = hierfavg(topology=topo, periods=p["period"] if topo.depth > 1 else None, **kw)
  except ValueError as e:
    assert "=" in str(e), f"a refusal must name the bad value: {e}"
    return
  state = loop.run(alg, as_device(data), num_rounds=2, key=jax.random.key(0), rounds_per_call=2)
  assert int(state.round) == 2
  levels = alg.models(state)
  for name, nm in levels.items():
    for leaf in jax.tree.leaves(nm.params):
      assert np.isfinite(np.asarray(leaf)).all(), name
    rows = jax.tree.leaves(nm.params)[0].shape[0]
    owner = np.asarray(nm.model_of_client)
    assert owner.shape == (n,) and 0 <= owner.min() and owner.max() < rows, name


def fuzz(max_examples: int) -> settings:
  return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])


@fuzz(4)
@given(problems())
def test_fuzz_small(p):
  _check(p)


@pytest.mark.slow
@fuzz(1000)
@given(problems())
def test_fuzz_1000(p):
  _check(p)
