"""FedDyn: the vectorized rounds against a per-client loop written from Algorithm 1 (flat, with
data-size weights and per-client α, and on a tree), α = 0 as FedAvg, α as a sweep axis, the
compositions (privacy, compression, systems) and bytes, and the refusals."""

import jax
import numpy as np
import optax
import pytest
import reference_baselines as ref

from fedtree.algorithms import fedavg, feddyn
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.server_rule import ServerRule
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.models import build_model
from fedtree.toolbox.privacy import central, clip
from fedtree.toolbox.robust import median

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  return ref.small_problem()


def _reference(
  model, data, x0, parent, rounds, key, *, cohort_size, alpha, steps, weights, alpha_scale, root_period=None,
  dtype=np.float32, combine=None,
):
  """Algorithm 1 per parent of clients (its own x and h; m its clients), the root (if any)
  averaging the parents' models by their clients' weights every ``root_period`` rounds (the clients
  train in ``dtype``: float64 in tests/x64_references.py). ``combine(list of trees)``: a robust
  estimate in place of the weighted mean, of the models and of their moves alike."""
  parent = np.asarray(parent)
  zeros = jax.tree.map(np.zeros_like, ref.np64(x0))
  grad_l = [zeros for _ in range(data.num_clients)]
  h = [zeros for _ in range(int(parent.max()) + 1)]
  total = np.bincount(parent, weights=weights)

  def client(rk, k, p, x):
    theta, grad_l[k] = ref.feddyn_client(
      model,
      x,
      grad_l[k],
      data,
      k,
      steps[k],
      ref.train_key(rk, k),
      lr=LR,
      batch_size=B,
      alpha=alpha * alpha_scale[k],
      dtype=dtype,
    )
    return theta

  def server(p, x, answers):
    w = [weights[k] for k, _ in answers]
    if combine is not None:
      est = combine([ref.np64(t) for _, t in answers])
      moved = jax.tree.map(lambda e, xx: sum(w) / total[p] * (e - xx), est, x)
      h[p] = jax.tree.map(lambda hh, d: hh - alpha * d, h[p], moved)
      return jax.tree.map(lambda m, hh: m - (hh / alpha if alpha > 0 else 0.0), est, h[p])
    mean = jax.tree.map(
      lambda *t: sum(wi * np.asarray(ti, np.float64) for wi, ti in zip(w, t, strict=True)) / sum(w),
      *[t for _, t in answers],
    )
    moved = jax.tree.map(
      lambda xx, *t: (
        sum(wi * (np.asarray(ti, np.float64) - xx) for wi, ti in zip(w, t, strict=True)) / total[p]
      ),
      x,
      *[t for _, t in answers],
    )
    h[p] = jax.tree.map(lambda hh, d: hh - alpha * d, h[p], moved)
    return jax.tree.map(lambda m, hh: m - (hh / alpha if alpha > 0 else 0.0), mean, h[p])

  root_weights = list(total) if root_period else None
  x = ref.run_rounds(
    data,
    x0,
    parent,
    rounds,
    key,
    cohort_size=cohort_size,
    client=client,
    server=server,
    root_period=root_period,
    root_weights=root_weights,
  )
  return x, h, grad_l


@pytest.mark.parametrize(
  "weighting,by_size", [("uniform", False), pytest.param("examples", True, marks=pytest.mark.slow)]
)
def test_feddyn_matches_algorithm_1_per_client(problem, weighting, by_size):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)  # unequal step counts
  alpha = 0.3
  alg = feddyn(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=sched,
    cohort_size=4,
    chunk_size=2,
    alpha=alpha,
    weighting=weighting,
    alpha_by_data_size=by_size,
  )
  key = jax.random.key(11)
  state, _ = ref.run_jit(alg, data, 3, key)
  x0 = ref.start(alg)
  n = np.asarray(data.n_train, np.float64)
  weights = n if weighting == "examples" else np.ones_like(n)
  scale = n.mean() / n if by_size else np.ones_like(n)
  x, h, grad_l = _reference(
    model,
    data,
    x0,
    np.zeros(data.num_clients, int),
    3,
    key,
    cohort_size=4,
    alpha=alpha,
    steps=sched.num_steps(np.asarray(data.n_train)),
    weights=weights,
    alpha_scale=scale,
  )
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(state.server_state, 0), h[0])
  for k in range(data.num_clients):
    ref.close(ref.row(state.client_state, k), grad_l[k])


def test_a_robust_aggregator_moves_the_model_and_h_by_its_estimate(problem):
  """Issue 55's stated rule: the coordinate-wise median replaces the mean of the models, and ``h``
  moves by ``α`` times the reporting share of the median's move; Algorithm 1 with the median in both."""
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  alg = feddyn(model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=5,
               chunk_size=2, alpha=0.3, update_paths=UpdatePath(aggregator=median()))
  key = jax.random.key(11)
  state, _ = ref.run_jit(alg, data, 3, key)
  n = np.asarray(data.n_train, np.float64)
  med = lambda trees: jax.tree.map(lambda *a: np.median(np.stack(a), axis=0), *trees)   # noqa: E731
  x, h, grad_l = _reference(model, data, ref.start(alg), np.zeros(data.num_clients, int), 3, key,
                            cohort_size=5, alpha=0.3, steps=sched.num_steps(np.asarray(data.n_train)),
                            weights=np.ones_like(n), alpha_scale=np.ones_like(n), combine=med)
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(state.server_state, 0), h[0])
  for k in range(data.num_clients):
    ref.close(ref.row(state.client_state, k), grad_l[k])


@pytest.mark.slow  # ~50 s on the loaded 2-core machine; the flat loop above stays in the default run
def test_feddyn_on_a_tree_keeps_h_at_the_clients_parents(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)  # root -> 3 edges -> 9 clients
  alpha = 0.2
  alg = feddyn(
    model=model,
    data=data,
    topology=topo,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=3),
    cohort_size=2,
    periods=(2,),
    alpha=alpha,
  )
  key = jax.random.key(4)
  state, _ = ref.run_jit(alg, data, 4, key)
  assert jax.tree.leaves(state.server_state)[0].shape[0] == 3  # one h per edge server
  x0 = ref.start(alg)
  ones = np.ones(data.num_clients)
  x, h, _ = _reference(
    model,
    data,
    x0,
    topo.parent(2),
    4,
    key,
    cohort_size=2,
    alpha=alpha,
    steps=np.full(data.num_clients, 3),
    weights=ones,
    alpha_scale=ones,
    root_period=2,
  )
  for g in range(3):
    ref.close(ref.row(state.params[1], g), x[g])
    ref.close(ref.row(state.server_state, g), h[g])
  ref.close(ref.row(state.params[0], 0), x[0])


def test_alpha_zero_is_fedavg_every_round(problem):
  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=3),
    cohort_size=4,
  )
  a, _ = ref.run_jit(feddyn(alpha=0.0, **common), data, 3, jax.random.key(2))
  b, _ = ref.run_jit(fedavg(weighting="uniform", **common), data, 3, jax.random.key(2))
  ref.close(a.params[0], b.params[0], atol=1e-6)
  c, _ = ref.run_jit(feddyn(alpha=0.1, **common), data, 1, jax.random.key(2))  # (a test that can fail)
  assert not np.allclose(
    np.asarray(jax.tree.leaves(c.params[0])[0]), np.asarray(jax.tree.leaves(b.params[0])[0])
  )


@pytest.mark.slow
def test_alpha_is_a_sweep_axis(problem):
  """Each experiment of a sweep over α is the run with that α done alone."""
  from fedtree.core.sweep import experiment, sweep

  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=2),
    cohort_size=3,
  )
  swept = sweep(lambda hp: feddyn(alpha=hp["alpha"], **common), {"alpha": [0.0, 0.5]}, [0, 0])
  st = swept.init(None)
  step = jax.jit(swept.round)
  for _ in range(2):
    st, _ = step(st, data, jax.random.key(0))
  from fedtree.core import loop

  for e, alpha in enumerate((0.0, 0.5)):
    alone = loop.run(feddyn(alpha=alpha, **common), data, num_rounds=2, key=jax.random.key(0))
    ref.close(experiment(st, e).params[0], alone.params[0], atol=1e-6)
    ref.close(experiment(st, e).server_state, alone.server_state, atol=1e-6)


@pytest.mark.slow   # four builds; the bytes of one model are also checked by test_traffic's FedAvg
def test_feddyn_composes_with_privacy_compression_and_systems_and_sends_one_model(problem):
  from fedtree.toolbox.compression import qsgd, uplink
  from fedtree.toolbox.systems import Systems, deadline, make_profile

  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=2),
    alpha=0.1,
    cohort_size=4,
  )
  _, m = ref.run_jit(feddyn(**common), data, 1, jax.random.key(0))
  assert "uplink_bytes" not in m and "downlink_bytes" not in m  # one model each way, as FedAvg
  dp = UpdatePath(client=clip(0.5), node=central(0.5, 0.5))
  s, m = ref.run_jit(feddyn(update_paths=dp, **common), data, 2, jax.random.key(0))
  assert "dp_update_norm" in m and all(
    np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(s.server_state)
  )
  s, m = ref.run_jit(
    feddyn(update_paths=UpdatePath(client=uplink(qsgd(bits=4))), **common),
    data,
    2,
    jax.random.key(0),
  )
  assert float(m["uplink_bytes"]) < sum(a[0].size * 4 for a in jax.tree.leaves(s.params[0]))
  systems = Systems(
    profile=make_profile(np.linspace(0.5, 4, data.num_clients), np.full(data.num_clients, 1e6)),
    policy=deadline(1.0, partial=True),
  )
  s, m = ref.run_jit(feddyn(systems=systems, **common), data, 2, jax.random.key(0))
  assert "round_seconds" in m and np.isfinite(np.asarray(jax.tree.leaves(s.client_state)[0])).all()


def test_feddyn_refusals(problem):
  data, _, model = problem
  common = dict(
    model=model, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=1)
  )
  with pytest.raises(ValueError, match=r"feddyn: alpha=-0.1 must be a finite number >= 0"):
    feddyn(alpha=-0.1, **common)
  with pytest.raises(ValueError, match=r"weighting='size'"):
    feddyn(weighting="size", **common)
  with pytest.raises(ValueError, match="personal parameters are not supported"):
    feddyn(personal=personal("Dense_1"), **common)
  with pytest.raises(ValueError, match="server_rule='mine'; feddyn keeps its own"):
    feddyn(
      server_rule=ServerRule(
        init=lambda p, n: (), receive=lambda i, s: (i.pseudo_gradient, s, {}), name="mine"
      ),
      **common,
    )
  bn = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"feddyn: the model keeps state \['batch_stats'\]"):
    feddyn(**{**common, "model": bn})


def test_a_bad_alpha_from_a_config_names_the_run_before_anything_compiles():
  import ml_collections
  from helpers import small_context

  from fedtree.experiment import registry

  ctx = small_context()
  run = ml_collections.ConfigDict({"algorithm": "feddyn", "alpha": -1.0})
  with pytest.raises(ValueError, match=r"config.runs.dyn \(algorithm='feddyn'\): feddyn: alpha=-1.0 must be"):
    registry.build_algorithm("dyn", run, ctx)
  run = ml_collections.ConfigDict({"algorithm": "feddyn", "alpah": 0.1})
  with pytest.raises(ValueError, match=r"unknown field 'alpah' \(did you mean 'alpha'\?\)"):
    registry.build_algorithm("dyn", run, ctx)
