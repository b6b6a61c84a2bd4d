"""A round over a window of the population (fedtree.core.window): the rows of the clients it reads, in
any order, in place of every client's, computes bitwise what the round over the whole population
computes, for the algorithms that can say which clients a round reads; the others say they cannot."""

import jax
import numpy as np
import optax
import pytest
from helpers import trees_equal

from fedtree import algorithms as A
from fedtree.core.data import WINDOW_END, as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.rng import stream
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.core.window import client_leaves, unwindow_state, window_data, window_of, window_state
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model
from fedtree.toolbox.compression import qsgd, uplink

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(group_sizes=(5, 4, 3), dim=6, num_classes=3, seed=1)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, model


def _cases(data, groups, model):
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    cohort_size=2,
    schedule=LocalSchedule(batch_size=B, steps=2, batch_order="cyclic"),
  )
  tree = Topology.from_labels(groups)
  return {
    "hierfavg": lambda: A.hierfavg(topology=tree, **common),
    "scaffold": lambda: A.scaffold(local_learning_rate=LR, topology=tree, **common),  # c_i per client
    "ditto": lambda: A.ditto(lam=0.1, **common),  # v_i per client
    "fedper": lambda: A.fedper(topology=tree, **common),  # personal leaves
    "error_feedback": lambda: A.fedavg(  # path state
      update_paths=UpdatePath(client=uplink(qsgd(bits=2), error_feedback=True)), **common
    ),
    "power_of_choice": lambda: A.fedavg(sampling="power_of_choice", **common),  # reads candidates
    "personal_level": lambda: A.hierfavg(topology=tree, personal=personal("Dense_1", level=1), **common),
  }


@pytest.mark.parametrize(
  "name", ["hierfavg", "scaffold", "ditto", "fedper", "error_feedback", "power_of_choice", "personal_level"]
)
def test_a_round_over_a_window_is_the_round_over_the_population(problem, name):
  """Two rounds: the window holds the clients each round reads (and a few more, and empty rows);
  the state's per-client rows outside it are untouched; everything is bitwise the resident run's."""
  data, groups, model = problem
  alg = _cases(data, groups, model)[name]()
  assert alg.reads is not None
  step = jax.jit(alg.round)
  root = jax.random.key(7)
  full = alg.init(jax.random.key(0))
  resident = full
  rng = np.random.default_rng(0)
  for _ in range(2):
    key = jax.random.fold_in(root, full.round)
    read = np.asarray(alg.reads.clients(full, key))
    extra = rng.choice(data.num_clients, 2)
    rows, valid, window = window_of(np.concatenate([read, extra]), data.num_clients, size=len(read) + 4)
    assert window.shape == rows.shape and np.all(np.diff(window[valid]) > 0)   # ascending ids, none of size C
    assert np.all(window[~valid] == WINDOW_END) and (~valid).sum() >= 2
    wdata = window_data(data, rows, window)
    new, metrics = step(window_state(full, rows), wdata, key)
    full = unwindow_state(full, new, rows, valid)
    resident, want = step(resident, data, key)
    trees_equal(full, resident)
    trees_equal(metrics, want)


def test_the_clients_a_round_reads_are_its_cohort(problem):
  data, groups, model = problem
  alg = A.fedavg(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    cohort_size=3,
    schedule=LocalSchedule(batch_size=B, steps=1),
  )
  state = alg.init(jax.random.key(0))
  key = jax.random.key(3)
  from fedtree.core.sampling import cohort_sampler

  want = cohort_sampler(np.zeros(data.num_clients, np.int32), 3)(stream(key, "cohort"))
  got = np.asarray(alg.reads.clients(state, key))
  assert set(got.tolist()) >= set(np.asarray(want.clients)[np.asarray(want.valid)].tolist())
  assert alg.reads.needs_state is False


def test_methods_that_read_other_clients_cannot_stream(problem):
  """FedAMP's parcels mix a parent's cohort, FedFomo's read other clients' models, kNN-Per rebuilds every
  client's memory: no window."""
  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    cohort_size=3,
    schedule=LocalSchedule(batch_size=B, steps=1),
  )
  assert A.fedamp(**common).reads is None
  assert A.fedfomo(num_candidates=2, **common).reads is None
  assert A.knnper(**common).reads is None   # (every round rebuilds every client's memory)


def test_client_leaves_are_the_states_client_rows(problem):
  data, groups, model = problem
  alg = A.scaffold(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    local_learning_rate=LR,
    schedule=LocalSchedule(batch_size=B, steps=1, batch_order="cyclic"),
  )
  state = alg.init(jax.random.key(0))
  marks = client_leaves(state)
  assert all(jax.tree.leaves(marks.client_state)) and all(jax.tree.leaves(marks.cursor))
  assert not any(jax.tree.leaves(marks.params)) and not any(jax.tree.leaves(marks.server_state))


def test_window_refusals():
  with pytest.raises(ValueError, match=r"client 12 is outside the population \(0..11\)"):
    window_of([0, 12], 12)
  with pytest.raises(ValueError, match="3 distinct clients do not fit a window of 2 rows"):
    window_of([0, 1, 2, 1], 12, size=2)


def test_a_window_in_segments_keeps_each_range_in_its_own_rows():
  """window_of with bounds (a streamed run over several processes): segment q holds the clients of
  bounds[q]..bounds[q+1]-1 and pads with its last id, so the window stays ascending and searchsorted
  finds every held client at its row; the padding is never valid (never written back)."""
  rows, valid, window = window_of([9, 1, 5, 3, 3, 7, 8], 12, 4, bounds=[0, 4, 8, 12])
  assert rows.tolist() == [1, 3, 3, 3, 5, 7, 7, 7, 8, 9, 11, 11]
  assert valid.tolist() == [True, True, False, False, True, True, False, False, True, True, False, False]
  assert window.tolist() == rows.tolist()
  held = np.array([1, 3, 5, 7, 8, 9])
  found = np.searchsorted(window, held, side="left")
  assert (rows[found] == held).all() and valid[found].all()
  rows, valid, _ = window_of([2], 12, 2, bounds=[0, 0, 12])   # an empty range pads with an id >= 0
  assert rows.tolist() == [0, 0, 2, 11] and valid.tolist() == [False, False, True, False]
  with pytest.raises(ValueError, match=r"3 distinct clients of 0..3 do not fit a segment of 2 rows"):
    window_of([0, 1, 2, 9], 12, 2, bounds=[0, 4, 12])
