"""A run over a population on disk (fedtree.population.stream): every call's window of clients read from
the store (ahead of time where the draw allows), per-client state paged; a population that fits gives
bitwise the resident run (final state, every per-client row, every round's metrics)."""

import functools
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import optax
import pytest
from helpers import trees_equal

from fedtree import algorithms as A
from fedtree.core import loop
from fedtree.core.data import as_device
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.core.window import client_leaves
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model
from fedtree.population import PagedState, write_federated_data
from fedtree.population.stream import paged_init, run, skeleton

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def population(tmp_path_factory):
  data, groups = grouped_synthetic(group_sizes=(6, 5, 4), dim=6, num_classes=3, seed=2)
  store = write_federated_data(
    str(tmp_path_factory.mktemp("pop") / "store"), data, source={"name": "grouped_synthetic"}
  )
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  return as_device(data), groups, store, model


def _build(name, data, groups, model):
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    cohort_size=2,
    schedule=LocalSchedule(batch_size=B, steps=2, batch_order="cyclic"),
  )
  tree = Topology.from_labels(groups)
  return {
    "fedavg": lambda: A.fedavg(**common),
    "scaffold": lambda: A.scaffold(local_learning_rate=LR, topology=tree, **common),
    "fedper": lambda: A.fedper(topology=tree, **common),
    "power_of_choice": lambda: A.fedavg(sampling="power_of_choice", **common),
  }[name]()


def _resident(alg, data, key, rounds, per_call):
  rows = []
  state = loop.run(
    alg, data, num_rounds=rounds, key=key, rounds_per_call=per_call, on_rounds=lambda r, m: rows.append(m)
  )
  return state, rows


@pytest.mark.parametrize(
  "name,per_call,depth",
  [("fedavg", 2, 2), pytest.param("scaffold", 2, 1, marks=pytest.mark.slow), ("fedper", 1, 0),
   pytest.param("power_of_choice", 3, 2, marks=pytest.mark.slow)],   # (tests/test_window.py has both)
)
def test_a_streamed_run_is_the_resident_run(population, name, per_call, depth):
  data, groups, store, model = population
  key = jax.random.key(4)
  want, want_rows = _resident(_build(name, data, groups, model), data, key, 5, per_call)
  skel = skeleton(store, width=int(data.x_train.shape[1]))
  alg = _build(name, skel, groups, model)
  others, rows_of = paged_init(alg, loop.init_key(key), skel.num_clients)
  paged = PagedState(lambda ids: rows_of(ids), skel.num_clients)
  got_rows = []
  state, stats = run(
    alg,
    skel,
    store,
    num_rounds=5,
    key=key,
    paged=paged,
    others=others,
    rounds_per_call=per_call,
    depth=depth,
    on_rounds=lambda r, m: got_rows.append(m),
  )
  assert stats.calls == len(want_rows)
  # Bitwise under XLA's default optimization (what a user's run compiles with). The tests' -O0
  # flags (conftest.py) keep a window's reductions over fewer rows in another order, so methods
  # that reduce per-client state (SCAFFOLD's control variates, FedPer's heads) then agree to
  # float32 rounding only; test_bitwise_under_default_flags reruns these cases bitwise.
  exact = name in ("fedavg", "power_of_choice") or os.environ.get("FEDTREE_TEST_XLA_OPT") == "1"
  same = trees_equal if exact else functools.partial(chex.assert_trees_all_close, rtol=1e-4, atol=1e-6)
  marks = jax.tree.leaves(client_leaves(want))
  same([a for a, c in zip(jax.tree.leaves(want), marks, strict=True) if not c],
       [b for b, c in zip(jax.tree.leaves(state), marks, strict=True) if not c])
  every = paged.gather(np.arange(skel.num_clients))
  same([a for a, c in zip(jax.tree.leaves(want), marks, strict=True) if c], every)
  same(got_rows, want_rows)


@pytest.mark.slow   # (40 s: compiles at XLA's default optimization; the cases above run in the default set)
def test_bitwise_under_default_flags():
  """The per-client-state cases above, bitwise, in a process compiled with XLA's default flags."""
  env = dict(os.environ, FEDTREE_TEST_XLA_OPT="1")
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if "optimization_level" not in f and "expensive_passes" not in f)
  cases = f"{__file__}::test_a_streamed_run_is_the_resident_run"
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", cases,
                        "-k", "scaffold or fedper"], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]


def test_an_algorithm_that_reads_every_client_cannot_stream(population):
  data, groups, store, model = population
  skel = skeleton(store, width=int(data.x_train.shape[1]))
  alg = A.fedfomo(
    model=model,
    data=skel,
    local_optimizer=optax.sgd(LR),
    cohort_size=3,
    num_candidates=2,
    schedule=LocalSchedule(batch_size=B, steps=1),
  )
  with pytest.raises(ValueError, match="fedfomo reads clients beyond its cohort"):
    run(alg, skel, store, num_rounds=1, key=jax.random.key(0), paged=None)


def test_a_stop_inside_a_streamed_call_ends_it_after_the_round_in_progress(population):
  """Issue 59 item 2: a streamed call of 5 fused rounds asked to stop before its third round ends at
  round 2, with the rows of the rounds it ran and the state of a resident run of 2 rounds."""
  data, groups, store, model = population
  key = jax.random.key(4)
  want, want_rows = _resident(_build("fedavg", data, groups, model), data, key, 2, 2)
  skel = skeleton(store, width=int(data.x_train.shape[1]))
  alg = _build("fedavg", skel, groups, model)
  others, rows_of = paged_init(alg, loop.init_key(key), skel.num_clients)
  asked, rows = [], []
  state, stats = run(alg, skel, store, num_rounds=5, key=key, paged=PagedState(rows_of, skel.num_clients),
                     others=others, rounds_per_call=5, depth=0,
                     on_rounds=lambda r, m: rows.append((r, m)),
                     should_stop=lambda: asked.append(1) or len(asked) >= 2)
  assert int(state.round) == 2 and stats.calls == 1
  assert [r for r, _ in rows] == [1] and all(len(v) == 2 for v in rows[0][1].values())
  resident = _build("fedavg", data, groups, model).models(want)["global"].params
  trees_equal(alg.models(state)["global"].params, resident)
  trees_equal(rows[0][1], want_rows[0])


def test_evaluation_chunks_spread_every_process_s_clients():
  """Over several processes (Layout with bounds) an evaluation's clients are cut so that each chunk holds
  at most a segment of every process's clients: every client once, each chunk's window fits."""
  from fedtree.population.stream import Layout

  where = Layout(None, np.array([0, 5, 10]), 2, 1)
  chunks = where.chunks([8, 0, 3, 1, 2, 6, 7])
  assert [c.tolist() for c in chunks] == [[0, 1, 6, 7], [2, 3, 8]]
  for c in chunks:
    rows, valid, _ = where.window(c, 10)
    assert sorted(rows[valid].tolist()) == c.tolist() and where.local(rows).tolist() in ([6, 7], [8, 9])
  assert [c.tolist() for c in Layout(None, None, 3).chunks([4, 1, 2, 0])] == [[0, 1, 2], [4]]
