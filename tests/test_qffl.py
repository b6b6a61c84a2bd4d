"""q-FFL by q-FedAvg: the vectorized rounds against a per-client loop written from Li et al. 2020
(Algorithm 2; the loss before training or from the last epoch, L = 1/η or given, uniform or
example weights, flat and on a tree), q = 0 is FedAvg, the bytes it sends, and bad input."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import reference_baselines as ref
from helpers import clipped, small_context

from fedtree.algorithms import fedavg, qffl
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.experiment import registry
from fedtree.toolbox import privacy as dp
from fedtree.toolbox.robust import median

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  return ref.small_problem()


def _run(alg, data, rounds, key):
  state, metrics = alg.init(jax.random.key(7)), None
  step = jax.jit(alg.round)
  for r in range(rounds):
    state, metrics = step(state, data, jax.random.fold_in(key, r))
  return state, metrics


def _slots(sampler, rk):
  drawn = sampler(stream(rk, "cohort"))
  return [(int(k), int(p)) for k, p, v in zip(np.asarray(drawn.clients), np.asarray(drawn.parent),
                                              np.asarray(drawn.valid), strict=True) if v]


def _start(alg):
  return jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])


@pytest.mark.parametrize("loss_at,q,lipschitz,weighting", [
  ("received", 2.0, None, "uniform"),
  pytest.param("last_epoch", 0.5, 3.0, "examples", marks=pytest.mark.slow),
])
def test_qffl_matches_algorithm_2_per_client(problem, loss_at, q, lipschitz, weighting):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=2)   # unequal step counts, two epochs
  alg = qffl(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR, schedule=sched,
             cohort_size=4, chunk_size=2, q=q, lipschitz=lipschitz, loss_at=loss_at, weighting=weighting)
  key = jax.random.key(11)
  state, metrics = _run(alg, data, 2, key)
  steps = sched.num_steps(np.asarray(data.n_train))
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 4)
  x = _start(alg)
  weights = None if weighting == "uniform" else np.asarray(data.n_train, np.float64)
  for r in range(2):
    rk = jax.random.fold_in(key, r)
    cohort = [k for k, _ in _slots(sampler, rk)]
    keys = [jax.random.fold_in(stream(rk, "train"), k) for k in cohort]
    new = ref.qffedavg_round(model, x, data, cohort, keys, q=q, lr=LR, lipschitz=lipschitz, batch_size=B,
                             steps=steps, loss_at=loss_at, weights=weights)
    x = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), new)
  ref.close(jax.tree.map(lambda p: p[0], state.params[0]), x)


@pytest.mark.parametrize("what", ["median", "joint clip"])
def test_qffl_sends_h_k_through_the_updates_path(problem, what):
  """Issue 55: the ``h_k`` take the update's robust rule (the step ``med Δ / med h``) or its client stage
  (one clip over the pair ``(Δ_k, h_k)``, as local and central DP clip): Algorithm 2 with the same rule on
  both."""
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  c = 2.0
  path = UpdatePath(aggregator=median()) if what == "median" else UpdatePath(client=dp.clip(c))
  alg = qffl(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR, schedule=sched,
             cohort_size=5, chunk_size=2, q=1.0, update_paths=path)
  key = jax.random.key(11)
  state, metrics = _run(alg, data, 2, key)
  if what != "median":
    assert float(metrics["dp_unclipped"]) < 1.0   # the clip bites
  med = lambda trees: jax.tree.map(lambda *a: np.median(np.stack(a), axis=0), *trees)   # noqa: E731
  steps = sched.num_steps(np.asarray(data.n_train))
  sampler = cohort_sampler(np.zeros(data.num_clients, int), 5)
  x = _start(alg)
  for r in range(2):
    rk = jax.random.fold_in(key, r)
    cohort = [k for k, _ in _slots(sampler, rk)]
    keys = [jax.random.fold_in(stream(rk, "train"), k) for k in cohort]
    new = ref.qffedavg_round(model, x, data, cohort, keys, q=1.0, lr=LR, lipschitz=None, batch_size=B,
                             steps=steps, loss_at="received", combine=med if what == "median" else None,
                             transform=None if what == "median" else clipped(c))
    x = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), new)
  ref.close(jax.tree.map(lambda p: p[0], state.params[0]), x)


@pytest.mark.slow   # (the flat reference test is its fast sibling)
def test_qffl_on_a_tree_runs_q_fedavg_at_every_edge(problem):
  """Round 1: every edge's q-FedAvg step over its own clients (the root waits: periods=(2,));
  round 2: the same, then the root's mean of the edges by their clients (uniform weighting)."""
  data, groups, model = problem
  topo = Topology.from_labels(groups)
  sched = LocalSchedule(batch_size=B, steps=3)
  alg = qffl(model=model, data=data, topology=topo, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
             schedule=sched, cohort_size=2, periods=(2,), q=1.0)
  key = jax.random.key(4)
  parent = topo.parent(2)
  sampler = cohort_sampler(parent, 2)
  steps = np.full(data.num_clients, 3)
  x = [_start(alg)] * 3
  for r in range(2):
    rk = jax.random.fold_in(key, r)
    slots = _slots(sampler, rk)
    for g in range(3):
      cohort = [k for k, p in slots if p == g]
      new = ref.qffedavg_round(model, x[g], data, cohort,
                               [jax.random.fold_in(stream(rk, "train"), k) for k in cohort], q=1.0, lr=LR,
                               lipschitz=None, batch_size=B, steps=steps, loss_at="received")
      x[g] = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), new)
    state, _ = _run(alg, data, r + 1, key)
    if r == 0:
      for g in range(3):
        ref.close(jax.tree.map(lambda p, g=g: p[g], state.params[1]), x[g])
  sizes = [float(np.sum(parent == g)) for g in range(3)]
  root = jax.tree.map(lambda *m: sum(w * np.asarray(a, np.float64) for w, a in zip(sizes, m, strict=True))
                      / sum(sizes), *x)
  ref.close(jax.tree.map(lambda p: p[0], state.params[0]), root)


def test_q_zero_is_fedavg(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=3), cohort_size=4)
  key = jax.random.key(2)
  a, _ = _run(qffl(q=0.0, local_learning_rate=LR, **common), data, 3, key)
  b, _ = _run(fedavg(weighting="uniform", **common), data, 3, key)
  ref.close(a.params[0], b.params[0], atol=2e-6)


def test_qffl_sends_one_model_and_one_float(problem):
  """Δ_k travels as a model, h_k as one float32; where the path compresses, both are compressed (fp16:
  half the model's bytes and 2 for h_k)."""
  from fedtree.toolbox.compression import fp16, uplink

  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
                schedule=LocalSchedule(batch_size=B, steps=1), cohort_size=3)
  _, metrics = _run(qffl(**common), data, 1, jax.random.key(0))
  size = sum(int(np.prod(np.shape(p))) * 4 for p in jax.tree.leaves(model.init(jax.random.key(0))))
  assert float(metrics["uplink_bytes"]) == size + 4
  assert float(metrics["downlink_bytes"]) == size
  _, metrics = _run(qffl(update_paths=UpdatePath(client=uplink(fp16())), **common), data, 1,
                    jax.random.key(0))
  assert float(metrics["uplink_bytes"]) == size // 2 + 2


def test_loss_epsilon_is_an_option(problem):
  """Issue 57 item 6: ``F_k + ε`` with the ε a run gives (FLGo's 1e-8; the paper's code's 1e-10 by
  default), set from a run config as any field; a large one shows in a float32 round."""
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, steps=2)
  ctx = small_context()
  run = ml_collections.ConfigDict({"algorithm": "qffl", "q": 2.0, "loss_epsilon": 0.25})
  assert registry.factory_kwargs("fair", run, ctx)["loss_epsilon"] == 0.25
  alg = qffl(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR, schedule=sched,
             cohort_size=4, q=2.0, loss_epsilon=0.25)
  key = jax.random.key(5)
  state, _ = _run(alg, data, 1, key)
  rk = jax.random.fold_in(key, 0)
  cohort = [k for k, _ in _slots(cohort_sampler(np.zeros(data.num_clients, int), 4), rk)]
  keys = [jax.random.fold_in(stream(rk, "train"), k) for k in cohort]
  kw = dict(q=2.0, lr=LR, lipschitz=None, batch_size=B, steps=sched.num_steps(np.asarray(data.n_train)),
            loss_at="received")
  want = ref.qffedavg_round(model, _start(alg), data, cohort, keys, loss_epsilon=0.25, **kw)
  default = ref.qffedavg_round(model, _start(alg), data, cohort, keys, **kw)
  got = jax.tree.map(lambda p: p[0], state.params[0])
  ref.close(got, want)
  with pytest.raises(AssertionError):
    ref.close(got, default)
  with pytest.raises(ValueError, match=r"qffl: loss_epsilon=-1e-08 must be a finite number >= 0"):
    qffl(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR, schedule=sched,
         loss_epsilon=-1e-8)


def test_qffl_refusals(problem):
  data, _, model = problem
  common = dict(model=model, data=data, local_optimizer=optax.sgd(LR),
                schedule=LocalSchedule(batch_size=B, steps=1), local_learning_rate=LR)
  with pytest.raises(ValueError, match=r"qffl: q=-1.0 must be a finite number >= 0"):
    qffl(q=-1.0, **common)
  with pytest.raises(ValueError, match=r"qffl: lipschitz=0.0 must be a finite number > 0"):
    qffl(lipschitz=0.0, **common)
  with pytest.raises(ValueError, match=r"loss_at='after'; choose one of \('received', 'last_epoch'\)"):
    qffl(loss_at="after", **common)
  with pytest.raises(ValueError, match=r"lipschitz=None takes L = 1/η from the local learning rate"):
    qffl(**{**common, "local_learning_rate": None})
  private = UpdatePath(client=dp.clip(1.0), node=dp.central(1.0, 1.0))
  qffl(update_paths=private, weighting="uniform", **common)   # (the h_k travel the path: issue 55)
  with pytest.raises(ValueError, match=r"qffl: weighting='examples' with an update path's robust aggregator "
                                       r"or client or node stage at the clients' tier: the clients' h_k"):
    qffl(update_paths=private, weighting="examples", **common)
  with pytest.raises(ValueError, match=r"qffl: weighting='examples' with an update path's robust"):
    qffl(update_paths=UpdatePath(aggregator=median()), cohort_size=4, weighting="examples", **common)
  with pytest.raises(ValueError, match=r"qffl: personal parameters are not supported"):
    qffl(personal=personal("Dense_1"), **common)
  ctx = small_context()
  with pytest.raises(ValueError, match=r"config.runs.fair \(algorithm='qffl'\): qffl: q=-2.0 must be"):
    registry.build_algorithm("fair", ml_collections.ConfigDict({"algorithm": "qffl", "q": -2.0}), ctx)
  private_run = {"algorithm": "qffl", "weighting": "uniform",
                 "privacy": {"clip_norm": 1.0, "noise_multiplier": 0.5}}
  registry.build_algorithm("fair", ml_collections.ConfigDict(private_run), ctx)   # (was refused: issue 55)
