"""FedNova: the vectorized rounds against a per-client loop written from the paper (unequal step
counts from epochs and from per-client steps; momentum's ‖a‖₁; the three aggregations; flat and
on a tree), equal steps with plain SGD as FedAvg, systems' partial work, bytes, and refusals."""

import jax
import numpy as np
import optax
import pytest
import reference_baselines as ref

from fedtree.algorithms import fedavg, fednova
from fedtree.algorithms.optimization.fednova import effective_steps
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.models import build_model
from fedtree.toolbox.robust import median

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  return ref.small_problem()


@pytest.mark.parametrize(
  "aggregation,weighting,momentum,per_client",
  [
    ("answered", "examples", 0.0, False),
    ("population", "examples", 0.9, True),
    pytest.param("scaled", "uniform", 0.5, False, marks=pytest.mark.slow),
  ],
)
def test_fednova_matches_the_papers_update_per_client(problem, aggregation, weighting, momentum, per_client):
  data, _, model = problem
  c = data.num_clients
  sched = (
    LocalSchedule(batch_size=B, steps=tuple(1 + i % 4 for i in range(c)))
    if per_client
    else LocalSchedule(batch_size=B, epochs=1)
  )  # unequal step counts either way
  alg = fednova(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR, momentum=momentum or None),
    schedule=sched,
    cohort_size=4,
    chunk_size=2,
    momentum=momentum,
    aggregation=aggregation,
    weighting=weighting,
  )
  key = jax.random.key(11)
  state, metrics = ref.run_jit(alg, data, 3, key)
  x0 = ref.start(alg)
  n = np.asarray(data.n_train, np.float64)
  weights = n if weighting == "examples" else np.ones_like(n)
  x = ref.fednova_rounds(
    model,
    data,
    x0,
    np.zeros(c, int),
    3,
    key,
    cohort_size=4,
    aggregation=aggregation,
    weights=weights,
    steps=sched.num_steps(np.asarray(data.n_train)),
    momentum=momentum,
    lr=LR,
    batch_size=B,
  )
  ref.close(ref.row(state.params[0], 0), x[0])
  assert float(metrics["tau_eff"]) > 0


def test_a_robust_aggregator_takes_the_normalized_updates(problem):
  """Issue 55: the coordinate-wise median of the ``d_i`` in place of their weighted mean, ``τ_eff`` the
  weighted mean of the ``‖a_i‖₁`` (the server's, from the steps it assigned): the paper's update
  with the median, over unequal step counts and example weights."""
  data, _, model = problem
  c = data.num_clients
  sched = LocalSchedule(batch_size=B, steps=tuple(1 + i % 4 for i in range(c)))
  alg = fednova(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=5,
                chunk_size=2, weighting="examples", update_paths=UpdatePath(aggregator=median()))
  key = jax.random.key(11)
  state, metrics = ref.run_jit(alg, data, 3, key)
  med = lambda trees: jax.tree.map(lambda *a: np.median(np.stack(a), axis=0), *trees)   # noqa: E731
  x = ref.fednova_rounds(model, data, ref.start(alg), np.zeros(c, int), 3, key, cohort_size=5,
                         aggregation="answered", weights=np.asarray(data.n_train, np.float64),
                         steps=sched.num_steps(np.asarray(data.n_train)), momentum=0.0, lr=LR, batch_size=B,
                         combine=med)
  ref.close(ref.row(state.params[0], 0), x[0])
  assert float(metrics["tau_eff"]) > 1


def test_effective_steps_of_momentum_is_the_papers_sum():
  for rho in (0.0, 0.5, 0.9):
    for tau in (0, 1, 2, 7):
      want = sum((1 - rho**k) / (1 - rho) for k in range(1, tau + 1))
      np.testing.assert_allclose(float(effective_steps(tau, rho, 10)), want, rtol=1e-6)


@pytest.mark.slow  # ~40 s on the loaded 2-core machine; the flat loops above stay in the default run
def test_fednova_on_a_tree_normalizes_at_the_clients_parents(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)  # root -> 3 edges -> 9 clients
  sched = LocalSchedule(batch_size=B, epochs=1)
  alg = fednova(
    model=model,
    data=data,
    topology=topo,
    local_optimizer=optax.sgd(LR),
    schedule=sched,
    cohort_size=2,
    periods=(2,),
  )
  key = jax.random.key(4)
  state, _ = ref.run_jit(alg, data, 4, key)
  x0 = ref.start(alg)
  x = ref.fednova_rounds(
    model,
    data,
    x0,
    topo.parent(2),
    4,
    key,
    cohort_size=2,
    aggregation="answered",
    weights=np.asarray(data.n_train, np.float64),
    steps=sched.num_steps(np.asarray(data.n_train)),
    momentum=0.0,
    lr=LR,
    batch_size=B,
    root_period=2,
  )
  for g in range(3):
    ref.close(ref.row(state.params[1], g), x[g])
  ref.close(ref.row(state.params[0], 0), x[0])


def test_equal_steps_and_plain_sgd_is_fedavg(problem):
  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=3),
    cohort_size=4,
  )
  a, m = ref.run_jit(fednova(**common), data, 2, jax.random.key(2))
  b, _ = ref.run_jit(fedavg(**common), data, 2, jax.random.key(2))
  ref.close(a.params[0], b.params[0], atol=1e-6)
  assert float(m["tau_eff"]) == pytest.approx(3.0)


def test_partial_work_lowers_tau_eff_and_fednova_sends_its_count(problem):
  from fedtree.toolbox.systems import Systems, deadline, make_profile

  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=4),
    cohort_size=5,
    weighting="uniform",
  )
  s, m = ref.run_jit(fednova(**common), data, 1, jax.random.key(0))
  size = sum(int(np.prod(np.shape(p))) * 4 for p in jax.tree.leaves(model.init(jax.random.key(0))))
  assert float(m["uplink_bytes"]) == size + 4 and float(m["downlink_bytes"]) == size  # the model and ‖a_i‖₁
  assert float(m["tau_eff"]) == pytest.approx(4.0)
  systems = Systems(
    profile=make_profile(np.linspace(0.5, 4, data.num_clients), np.full(data.num_clients, 1e6)),
    policy=deadline(1.0, partial=True),
  )
  s, m = ref.run_jit(fednova(systems=systems, **common), data, 1, jax.random.key(0))
  assert int(m["clients_partial"]) > 0 and 0 < float(m["tau_eff"]) < 4.0
  assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(s.params))


def test_fednova_refusals(problem):
  data, _, model = problem
  common = dict(
    model=model, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=1)
  )
  with pytest.raises(
    ValueError,
    match=r"fednova: aggregation='mean'; choose one of \('answered', 'population', "
    r"'scaled'\)",
  ):
    fednova(aggregation="mean", **common)
  with pytest.raises(ValueError, match=r"fednova: momentum=1.0 must be in \[0, 1\)"):
    fednova(momentum=1.0, **common)
  with pytest.raises(ValueError, match="personal parameters are not supported"):
    fednova(personal=personal("Dense_1"), **common)
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"fednova: the model keeps state \['batch_stats'\]"):
    fednova(**{**common, "model": bn})


def test_the_registry_reads_the_local_momentum_and_names_bad_options():
  import ml_collections
  from helpers import small_context

  from fedtree.experiment import registry

  ctx = small_context()
  ctx.config.local.hparams = {"momentum": 0.9}
  kw = registry.factory_kwargs("nova", ml_collections.ConfigDict({"algorithm": "fednova"}), ctx)
  assert kw["momentum"] == 0.9
  run = ml_collections.ConfigDict({"algorithm": "fednova", "aggregation": "weighted_scale"})
  with pytest.raises(ValueError, match=r"config.runs.nova \(algorithm='fednova'\): fednova: "
                                       r"aggregation='weighted_scale'; choose one of"):
    registry.build_algorithm("nova", run, ctx)
  ctx.config.local.optimizer = "adam"
  with pytest.raises(ValueError, match=r"config.local.optimizer='adam'"):
    registry.factory_kwargs("nova", ml_collections.ConfigDict({"algorithm": "fednova"}), ctx)
