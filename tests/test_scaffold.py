"""SCAFFOLD: the vectorized rounds against a per-client loop written from Algorithm 1 (options I
and II, the variate averaged over all clients or the sampled ones, flat and on a tree), its
reduction to FedAvg, the bytes it sends, and its refusals."""

import jax
import numpy as np
import optax
import pytest
import reference_baselines as ref
from helpers import clipped

from fedtree.algorithms import fedavg, scaffold
from fedtree.core.local import LocalSchedule
from fedtree.core.personal import personal
from fedtree.core.topology import Topology
from fedtree.core.updates import UpdatePath
from fedtree.toolbox.robust import median

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  return ref.small_problem()


@pytest.mark.parametrize(
  "option,average,eta_g", [("II", "all", 1.0), ("II", "sampled", 0.7), ("I", "all", 1.0)]
)
def test_scaffold_matches_algorithm_1_per_client(problem, option, average, eta_g):
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)  # unequal step counts
  alg = scaffold(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    local_learning_rate=LR,
    schedule=sched,
    cohort_size=4,
    chunk_size=2,
    option=option,
    variate_average=average,
    server_learning_rate=eta_g,
  )
  key = jax.random.key(11)
  state, _ = ref.run_jit(alg, data, 3, key)
  x0 = ref.start(alg)
  steps = sched.num_steps(np.asarray(data.n_train))
  x, c, c_i = ref.scaffold_rounds(
    model,
    data,
    x0,
    np.zeros(data.num_clients, int),
    3,
    key,
    cohort_size=4,
    option=option,
    average=average,
    eta_g=eta_g,
    steps=steps,
    lr=LR,
    batch_size=B,
  )
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(state.server_state, 0), c[0], atol=2e-4)
  for k in range(data.num_clients):
    ref.close(ref.row(state.client_state, k), c_i[k], atol=2e-4)


def test_scaffold_on_a_tree_keeps_variates_at_the_clients_parents(problem):
  data, groups, model = problem
  topo = Topology.from_labels(groups)  # root -> 3 edges -> 9 clients
  sched = LocalSchedule(batch_size=B, steps=3)
  alg = scaffold(
    model=model,
    data=data,
    topology=topo,
    local_optimizer=optax.sgd(LR),
    local_learning_rate=LR,
    schedule=sched,
    cohort_size=2,
    periods=(2,),
  )
  key = jax.random.key(4)
  state, _ = ref.run_jit(alg, data, 4, key)
  assert jax.tree.leaves(state.server_state)[0].shape[0] == 3  # one c per edge server
  x0 = ref.start(alg)
  parent = topo.parent(2)
  weights = [float(np.sum(parent == g)) for g in range(3)]   # uniform weighting: clients under each edge
  x, c, c_i = ref.scaffold_rounds(
    model,
    data,
    x0,
    parent,
    4,
    key,
    cohort_size=2,
    option="II",
    average="all",
    eta_g=1.0,
    steps=np.full(data.num_clients, 3),
    root_period=2,
    weights=weights,
    lr=LR,
    batch_size=B,
  )
  for g in range(3):
    ref.close(ref.row(state.params[1], g), x[g])
    ref.close(ref.row(state.server_state, g), c[g], atol=2e-4)
  ref.close(ref.row(state.params[0], 0), x[0])


def test_first_round_with_zero_variates_is_fedavg(problem):
  data, _, model = problem
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=3),
    cohort_size=4,
  )
  a = scaffold(local_learning_rate=LR, **common)
  b = fedavg(weighting="uniform", **common)
  key = jax.random.key(2)
  sa, _ = a.round(a.init(jax.random.key(0)), data, key)
  sb, _ = b.round(b.init(jax.random.key(0)), data, key)
  ref.close(sa.params[0], sb.params[0], atol=1e-6)


def test_scaffold_sends_two_models_each_way(problem):
  data, _, model = problem
  alg = scaffold(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    local_learning_rate=LR,
    schedule=LocalSchedule(batch_size=B, steps=1),
    cohort_size=3,
  )
  _, metrics = ref.run_jit(alg, data, 1, jax.random.key(0))
  size = sum(int(np.prod(np.shape(p))) * 4 for p in jax.tree.leaves(model.init(jax.random.key(0))))
  assert float(metrics["uplink_bytes"]) == 2 * size
  assert float(metrics["downlink_bytes"]) == 2 * size
  plain = fedavg(
    model=model, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=1)
  )
  # FedAvg: one model, as before
  assert "uplink_bytes" not in ref.run_jit(plain, data, 1, jax.random.key(0))[1]


def test_scaffold_refusals(problem):
  data, _, model = problem
  common = dict(
    model=model, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=1)
  )
  with pytest.raises(ValueError, match=r"option='III'; choose one of \('I', 'II'\)"):
    scaffold(option="III", local_learning_rate=LR, **common)
  with pytest.raises(ValueError, match="needs the local learning rate"):
    scaffold(**common)
  with pytest.raises(ValueError, match=r"variate_average='most'; choose one of"):
    scaffold(variate_average="most", local_learning_rate=LR, **common)
  with pytest.raises(ValueError, match="personal parameters are not supported"):
    scaffold(local_learning_rate=LR, personal=personal("Dense_1"), **common)


@pytest.mark.parametrize("average", ["all", "sampled"])
def test_a_robust_aggregator_takes_the_variates_by_the_same_rule(problem, average):
  """Issue 55: the coordinate-wise median at the clients' parent over the updates and over the
  variates' changes alike (each parent's ``c`` moves by the median of ``Δc_i`` times the clients that
  reported, over ``N`` or over them), against Algorithm 1 with the median in both places."""
  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  alg = scaffold(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
                 schedule=sched, cohort_size=5, chunk_size=2, variate_average=average,
                 update_paths=UpdatePath(aggregator=median()))
  key = jax.random.key(12)
  state, _ = ref.run_jit(alg, data, 3, key)
  med = lambda trees: jax.tree.map(lambda *a: np.median(np.stack(a), axis=0), *trees)   # noqa: E731
  x, c, c_i = ref.scaffold_rounds(model, data, ref.start(alg), np.zeros(data.num_clients, int), 3, key,
                                  cohort_size=5, option="II", average=average, eta_g=1.0,
                                  steps=sched.num_steps(np.asarray(data.n_train)), lr=LR, batch_size=B,
                                  combine=med)
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(state.server_state, 0), c[0], atol=2e-4)
  for k in range(data.num_clients):
    ref.close(ref.row(state.client_state, k), c_i[k], atol=2e-4)



def test_dp_scaffold_clips_the_update_and_the_variates_as_one(problem):
  """Issue 55, user-level DP-SCAFFOLD: the client stage bounds the joint norm of ``(Δy_i, Δc_i)``
  (the variates' changes are privatized with the update, not left raw), the parent's ``c`` moves by the
  clipped changes' sum: Algorithm 1 with each client's pair clipped; the clients keep their own
  ``c_i``. The bytes up count both."""
  from fedtree.toolbox.compression import qsgd, uplink
  from fedtree.toolbox.privacy import clip

  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  c = 0.05
  alg = scaffold(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
                 schedule=sched, cohort_size=5, chunk_size=2, update_paths=UpdatePath(client=clip(c)))
  key = jax.random.key(12)
  state, metrics = ref.run_jit(alg, data, 3, key)
  assert float(metrics["dp_unclipped"]) < 1.0   # the clip bites
  x, cs, c_i = ref.scaffold_rounds(model, data, ref.start(alg), np.zeros(data.num_clients, int), 3, key,
                                   cohort_size=5, option="II", average="all", eta_g=1.0,
                                   steps=sched.num_steps(np.asarray(data.n_train)), lr=LR, batch_size=B,
                                   transform=clipped(c))
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(state.server_state, 0), cs[0], atol=2e-4)
  for k in range(data.num_clients):
    ref.close(ref.row(state.client_state, k), c_i[k], atol=2e-4)
  size = sum(int(np.prod(np.shape(p))) * 4 for p in jax.tree.leaves(model.init(jax.random.key(0))))
  assert float(metrics["uplink_bytes"]) == 2 * size   # (Δy_i, Δc_i), as without a path
  quantized = scaffold(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
                       schedule=sched, cohort_size=5, chunk_size=2,
                       update_paths=UpdatePath(client=uplink(qsgd(4))))
  up = float(ref.run_jit(quantized, data, 1, key)[1]["uplink_bytes"])
  assert 0 < up < 2 * size / 3   # both quantized: 4 bits an entry, a norm a leaf


def test_dp_scaffold_noises_the_variates_sum(problem):
  """Central DP's noise covers the variates' sum too: one round from the same start, with and without
  noise (z = 2, clip C), ``c`` differs by the noise over ``N``: its standard deviation over the model's
  D coordinates is ``2 z C / N`` (normalize="count": sensitivity ``2C``, replace-one) within 5 standard
  errors (``2 z C / (N √(2D))``)."""
  from fedtree.toolbox.privacy import central, clip

  data, _, model = problem
  sched = LocalSchedule(batch_size=B, steps=2)
  cn, z = 0.5, 2.0

  def run(noise):
    alg = scaffold(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
                   schedule=sched, weighting="uniform",
                   update_paths=UpdatePath(client=clip(cn), node=central(noise, cn)))
    return ref.run_jit(alg, data, 1, jax.random.key(4))[0]

  noisy, clean = run(z), run(0.0)
  diff = np.concatenate([np.ravel(np.asarray(a) - np.asarray(b)) for a, b in
                         zip(jax.tree.leaves(noisy.server_state), jax.tree.leaves(clean.server_state),
                             strict=True)])
  n = data.num_clients
  want = 2 * z * cn / n
  assert abs(float(np.std(diff)) - want) < 5 * want / np.sqrt(2 * diff.size), (np.std(diff), want)


def test_dp_scaffold_under_a_robust_rule_takes_the_clipped_pairs_blockwise(problem):
  """A client stage and a robust aggregator together: the clipped pairs ``(Δy_i, Δc_i)`` in the
  aggregator's blocks as one (no separate block of variates), the median of each against Algorithm 1
  with the pairs clipped jointly and the median in both places."""
  from fedtree.toolbox.privacy import clip

  data, _, model = problem
  sched = LocalSchedule(batch_size=B, epochs=1)
  c = 0.05
  alg = scaffold(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
                 schedule=sched, cohort_size=5, chunk_size=2,
                 update_paths=UpdatePath(client=clip(c), aggregator=median()))
  key = jax.random.key(12)
  state, _ = ref.run_jit(alg, data, 3, key)
  med = lambda trees: jax.tree.map(lambda *a: np.median(np.stack(a), axis=0), *trees)   # noqa: E731
  x, cs, _ = ref.scaffold_rounds(model, data, ref.start(alg), np.zeros(data.num_clients, int), 3, key,
                                 cohort_size=5, option="II", average="all", eta_g=1.0,
                                 steps=sched.num_steps(np.asarray(data.n_train)), lr=LR, batch_size=B,
                                 transform=clipped(c), combine=med)
  ref.close(ref.row(state.params[0], 0), x[0])
  ref.close(ref.row(state.server_state, 0), cs[0], atol=2e-4)
