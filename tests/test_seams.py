"""The engine's seams for the baselines: models with state (BatchNorm statistics from the real rows
of each batch, trained under FedAvg against a per-client loop and scored with their statistics),
personal parameters (per client or shared within a subtree, against per-client loops; never sent,
never aggregated), and every method over the HierFAVG host taking every option of the host."""

import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_baselines as ref

from fedtree import algorithms
from fedtree.algorithms import ditto, fedavg, hierfavg
from fedtree.algorithms.host.method import BOUND
from fedtree.core.data import as_device
from fedtree.core.local import ClientData, LocalSchedule, batch_at, train_loss
from fedtree.core.metrics import make_evaluator
from fedtree.core.personal import Personal, personal
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.core.topology import Topology
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model, masked_cross_entropy

LR, B = 0.1, 4


@pytest.fixture(scope="module")
def problem():
  data, groups = grouped_synthetic(
    group_sizes=(3, 2, 4),
    dim=6,
    num_classes=3,
    mean_examples=9,
    min_examples=3,
    max_examples=14,
    test_examples=5,
    seed=3,
  )
  return as_device(data), groups


def _cohorts(parent, cohort_size, key, rounds):
  sampler = cohort_sampler(parent, cohort_size)
  out = []
  for r in range(rounds):
    rk = jax.random.fold_in(key, r)
    c = sampler(stream(rk, "cohort"))
    out.append(
      (
        rk,
        [
          (int(k), int(p))
          for k, p, v in zip(np.asarray(c.clients), np.asarray(c.parent), np.asarray(c.valid), strict=True)
          if v
        ],
      )
    )
  return out


# ------------------------------------------------------------------------ models with state
def _bn_sgd(model, variables, data, client, steps, key):
  """Plain SGD of a BatchNorm model, by hand: the gradient of the trainable collection, the
  statistics taken from each step's forward pass on the batch's real rows."""
  cd = ClientData(
    x=jnp.asarray(data.x_train[client]),
    y=jnp.asarray(data.y_train[client]),
    n=jnp.asarray(data.n_train[client]),
  )
  batch_key, _ = jax.random.split(key)

  def loss(trainable, stats, b):
    logits, upd = model.apply_train({"params": trainable, "batch_stats": stats}, b.x, rng=None, mask=b.mask)
    return masked_cross_entropy(logits, b.y, b.mask), upd["batch_stats"]

  grad = jax.jit(jax.grad(loss, has_aux=True))
  v = variables
  for t in range(int(steps)):
    b = batch_at(batch_key, cd, jnp.asarray(t), B)
    g, stats = grad(v["params"], v["batch_stats"], b)
    v = {"params": jax.tree.map(lambda w, gw: w - LR * gw, v["params"], g), "batch_stats": stats}
  return v


def test_batchnorm_statistics_come_from_the_real_rows_only(problem):
  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  v = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (6, 6))
  padded = x.at[3:].set(1e6)  # padding rows that would wreck any statistic
  b = ClientData(x=padded, y=jnp.zeros(6, jnp.int32), n=jnp.asarray(3), shuffle=False)
  batch = batch_at(jax.random.key(0), b, jnp.asarray(0), 6)
  _, updated = train_loss(model, v, batch, None)
  h = x[:3] @ v["params"]["Dense_0"]["kernel"] + v["params"]["Dense_0"]["bias"][None]
  np.testing.assert_allclose(
    updated["batch_stats"]["BatchNorm_0"]["mean"], 0.1 * h.mean(0), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(updated["batch_stats"]["BatchNorm_0"]["var"], 0.9 + 0.1 * h.var(0), rtol=1e-5)
  _, again = train_loss(model, v, batch._replace(x=x.at[3:].set(-5.0)), None)  # other padding: same
  chex.assert_trees_all_equal(updated["batch_stats"], again["batch_stats"])


def test_batchnorm_model_under_fedavg_matches_a_per_client_loop(problem):
  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  sched = LocalSchedule(batch_size=B, epochs=1)
  alg = fedavg(
    model=model, data=data, local_optimizer=optax.sgd(LR), schedule=sched, cohort_size=4, chunk_size=2
  )
  key = jax.random.key(3)
  state, _ = ref.run_jit(alg, data, 3, key)
  theta = jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])
  steps = sched.num_steps(np.asarray(data.n_train))
  for rk, slots in _cohorts(np.zeros(data.num_clients, int), 4, key, 3):
    trained = [
      _bn_sgd(model, theta, data, k, steps[k], jax.random.fold_in(stream(rk, "train"), k)) for k, _ in slots
    ]
    w = [float(data.n_train[k]) for k, _ in slots]
    theta = jax.tree.map(
      lambda *m: sum(wi * np.asarray(a, np.float64) for wi, a in zip(w, m, strict=True)) / sum(w), *trained  # noqa: B023
    )
    theta = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), theta)
  ref.close(ref.row(state.params[0], 0), theta)
  # evaluation scores the model with the statistics it was trained with (running averages)
  ev = make_evaluator(model)(
    state.params[0], data.x_test, data.y_test, data.n_test, jnp.zeros(data.num_clients, jnp.int32)
  )
  logits = model.apply(theta, data.x_test[0], train=False)
  mine = masked_cross_entropy(logits, data.y_test[0], jnp.arange(data.x_test.shape[1]) < data.n_test[0])
  np.testing.assert_allclose(float(ev.loss_sum[0]) / float(ev.count[0]), float(mine), rtol=1e-4)


def test_objectives_that_do_not_update_statistics_refuse_a_batchnorm_model(problem):
  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  with pytest.raises(ValueError, match=r"perfedavg: the model keeps state \['batch_stats'\]"):
    algorithms.perfedavg(
      model=model, data=data, schedule=LocalSchedule(batch_size=B, steps=1), alpha=0.1, beta=0.1
    )


# ------------------------------------------------------------------------ personal parameters
def _personal_reference(
  model,
  data,
  theta,
  parent,
  rounds,
  key,
  *,
  head,
  level_weights=None,
  root_period=None,
  cohort_size=3,
  steps=2,
):
  """Per-client loop: the parent's model for the shared leaves, the client's own for ``head`` (a
  top-level key); the parents average the shared leaves of their sampled clients by examples (and
  the head, when ``level_weights`` says the head is shared within the parents); the root (if any)
  averages the parents' shared leaves only."""
  num_parents = int(parent.max()) + 1
  x = [ref.np64(theta) for _ in range(num_parents)]
  own = [ref.np64(theta[head]) for _ in range(data.num_clients)]
  client_head = level_weights is None
  for r, (rk, slots) in enumerate(_cohorts(parent, cohort_size, key, rounds)):
    trained = {p: [] for p in range(num_parents)}
    for k, p in slots:
      start = {**x[p], head: own[k]} if client_head else dict(x[p])
      start = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), start)
      from reference import local_sgd

      y = local_sgd(
        model, start, data, k, steps, jax.random.fold_in(stream(rk, "train"), k), lr=LR, batch_size=B
      )
      if client_head:
        own[k] = ref.np64(y[head])
      trained[p].append((float(data.n_train[k]), ref.np64(y)))
    for p in range(num_parents):
      if not trained[p]:
        continue
      tot = sum(w for w, _ in trained[p])
      avg = jax.tree.map(
        lambda *m: sum(w * a for (w, _), a in zip(trained[p], m, strict=True)) / tot,  # noqa: B023
        *[y for _, y in trained[p]],
      )
      x[p] = {k: (x[p][k] if (k == head and client_head) else avg[k]) for k in x[p]}
    if root_period and (r + 1) % root_period == 0:
      tot = sum(level_weights)
      root = jax.tree.map(lambda *m: sum(w * a for w, a in zip(level_weights, m, strict=True)) / tot, *x)  # noqa: B023
      x = [{k: (x[p][k] if k == head else root[k]) for k in root} for p in range(num_parents)]
  return x, own


def test_personal_head_per_client_matches_a_per_client_loop(problem):
  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  alg = fedavg(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=2),
    cohort_size=3,
    chunk_size=None,
    personal=personal("Dense_1"),
  )
  key = jax.random.key(8)
  state, metrics = ref.run_jit(alg, data, 3, key)
  theta = jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])
  x, own = _personal_reference(model, data, theta, np.zeros(data.num_clients, int), 3, key, head="Dense_1")
  ref.close(ref.row(state.params[0], 0)["Dense_0"], x[0]["Dense_0"])
  # the server's head never moves
  ref.close(ref.row(state.params[0], 0)["Dense_1"], ref.np64(theta["Dense_1"]))
  models = alg.models(state)
  assert set(models) == {"personal"}  # no global model: its head is nobody's
  for k in range(data.num_clients):
    ref.close(ref.row(models["personal"].params, k)["Dense_1"], own[k])
    ref.close(ref.row(models["personal"].params, k)["Dense_0"], x[0]["Dense_0"])
  body = sum(int(np.prod(np.shape(a))) * 4 for a in jax.tree.leaves(theta["Dense_0"]))
  assert float(metrics["uplink_bytes"]) == body and float(metrics["downlink_bytes"]) == body


def test_head_shared_within_each_edge_matches_a_per_client_loop(problem):
  data, groups = problem
  topo = Topology.from_labels(groups)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  alg = hierfavg(
    model=model,
    topology=topo,
    data=data,
    local_optimizer=optax.sgd(LR),
    periods=(2,),
    schedule=LocalSchedule(batch_size=B, steps=2),
    cohort_size=2,
    chunk_size=None,
    personal=personal("Dense_1", level=1),
  )
  key = jax.random.key(9)
  state, metrics = ref.run_jit(alg, data, 4, key)
  theta = jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])
  parent = topo.parent(2)
  weights = [float(np.sum(np.asarray(data.n_train)[parent == g])) for g in range(3)]
  x, _ = _personal_reference(
    model, data, theta, parent, 4, key, head="Dense_1", level_weights=weights, root_period=2, cohort_size=2
  )
  for g in range(3):
    ref.close(ref.row(state.params[1], g), x[g])
  assert set(alg.models(state)) == {"level1"}  # the root's head is nobody's
  body = sum(int(np.prod(np.shape(a))) * 4 for a in jax.tree.leaves(theta["Dense_0"]))
  assert "uplink_bytes" not in metrics or float(metrics["uplink_bytes"]) > body  # clients send the head too
  assert float(metrics["level0_uplink_bytes"]) == body  # the edges send the body up, never the head


def test_fedbn_statistics_never_leave_a_client(problem):
  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,), norm="batch")
  alg = fedavg(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=2),
    cohort_size=3,
    personal=personal(["BatchNorm"]),
  )
  state0 = alg.init(jax.random.key(7))
  state, metrics = ref.run_jit(alg, data, 3, jax.random.key(1))
  chex.assert_trees_all_equal(
    state.params[0]["batch_stats"], state0.params[0]["batch_stats"]
  )  # server: never
  chex.assert_trees_all_equal(
    state.params[0]["params"]["BatchNorm_0"], state0.params[0]["params"]["BatchNorm_0"]
  )
  personal_stats = alg.models(state)["personal"].params["batch_stats"]["BatchNorm_0"]["mean"]
  assert len({tuple(np.round(np.asarray(r), 6)) for r in personal_stats}) > 3  # each client its own
  dense = (
    sum(
      int(np.prod(np.shape(a))) * 4
      for k, a in jax.tree_util.tree_flatten_with_path(state0.params[0])[0]
      if "Dense" in jax.tree_util.keystr(k)
    )
    // 1
  )
  assert float(metrics["uplink_bytes"]) == dense


def test_every_parameter_personal_is_local_training(problem):
  data, _ = problem
  model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
  alg = fedavg(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=2),
    personal=personal(".*"),
  )
  key = jax.random.key(4)
  state, _ = ref.run_jit(alg, data, 2, key)
  from reference import local_sgd

  theta = jax.tree.map(lambda p: p[0], alg.init(jax.random.key(7)).params[0])
  own = alg.models(state)["personal"].params
  for k in range(data.num_clients):
    p = theta
    for r in range(2):
      p = local_sgd(
        model,
        p,
        data,
        k,
        2,
        jax.random.fold_in(stream(jax.random.fold_in(key, r), "train"), k),
        lr=LR,
        batch_size=B,
      )
    ref.close(ref.row(own, k), p)


def test_no_personal_parameters_is_bitwise_the_host(problem):
  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=2),
    cohort_size=3,
  )
  a, _ = ref.run_jit(fedavg(**common), data, 2, jax.random.key(0))
  b, _ = ref.run_jit(fedavg(personal=Personal(patterns=()), **common), data, 2, jax.random.key(0))
  chex.assert_trees_all_equal(a.params, b.params)


@pytest.mark.parametrize("name,given,message", [
  ("scaffold", "server_rule", r"scaffold: server_rule='mine'; scaffold keeps its own server rule"),
  ("qffl", "server_rule", r"qffl: server_rule='mine'; qffl keeps its own server rule"),
  ("fedprox", "client_update", r"fedprox: client_update=ClientUpdate; fedprox keeps its own client update"),
  ("fedproto", "personal", r"fedproto: personal=Personal; fedproto keeps its own personal"),
])
def test_an_option_the_method_sets_itself_is_refused_not_dropped(problem, name, given, message):
  """A host argument the caller gives and the method fixes (SCAFFOLD's server rule, FedProx's
  objective, FedProto's personal model) was dropped without a word; it is refused by name."""
  from fedtree.core.local import ClientUpdate
  from fedtree.core.server_rule import ServerRule

  data, _ = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  rule = ServerRule(init=lambda p, n: (), receive=lambda inbox, s: (inbox.pseudo_gradient, s, {}),
                    name="mine")
  values = {"server_rule": rule,
            "client_update": ClientUpdate(apply=lambda *a: a, init_state=None),
            "personal": personal("Dense_1")}
  own = {"fedprox": {"mu": 0.1}}
  with pytest.raises(ValueError, match=message):
    getattr(algorithms, name)(model=model, data=data, local_optimizer=optax.sgd(LR), local_learning_rate=LR,
                              schedule=LocalSchedule(batch_size=B, steps=1), **own.get(name, {}),
                              **{given: values[given]})


def test_personal_refusals(problem):
  data, groups = problem
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(5,))
  common = dict(
    model=model, data=data, local_optimizer=optax.sgd(LR), schedule=LocalSchedule(batch_size=B, steps=1)
  )
  with pytest.raises(
    ValueError,
    match=r"fedavg: personal pattern 'head' matches no parameter of the model; its "
    r"parameters are \['Dense_0/bias \(5,\)'",
  ):
    fedavg(personal=personal("head"), **common)
  with pytest.raises(
    ValueError, match="personal level=1: a tree of depth 1 shares within the subtrees of levels"
  ):
    fedavg(personal=personal("Dense_1", level=1), **common)
  with pytest.raises(ValueError, match="level >= 1"):
    personal("Dense_1", level=0)
  with pytest.raises(ValueError, match="not a regular expression"):
    personal("Dense_(")
  with pytest.raises(ValueError, match="personal models of its own"):
    ditto(lam=0.1, personal=personal("Dense_1"), **common)


# ------------------------------------------------------------------------ methods over the host
METHODS = ["fedavg", "fedprox", "ditto", "pfedme", "perfedavg", "fedmmd", "fedkws", "scaffold", "feddyn",
           "fednova", "mime", "mimelite", "moon", "qffl", "afl", "apfl", "fedala", "fedem", "knnper"]


@pytest.mark.parametrize("name", METHODS)
def test_every_method_takes_every_option_of_the_host(name):
  method = getattr(algorithms, name)
  own = set(inspect.signature(method).parameters)
  host = set(inspect.signature(hierfavg).parameters) - set(BOUND)
  dropped = {"fedavg": {"server_optimizers", "periods", "top_level", "topology"}}.get(name, set())
  assert host - dropped <= own, f"{name} lacks {sorted(host - dropped - own)}"
  hints = __import__("typing").get_type_hints(method)
  assert {"sampling", "systems", "candidates", "personal", "server_rule"} <= set(hints)


@pytest.mark.parametrize(
  "name,fields",
  [
    ("fedprox", {"mu": 0.1}),
    ("pfedme", {"lam": 5.0, "inner_steps": 1, "personal_lr": 0.05, "learning_rate": 0.05}),
  ],
)
def test_methods_run_poisson_sampling_and_systems_from_the_host(problem, name, fields):
  from fedtree.toolbox.systems import Systems, deadline, make_profile

  data, _ = problem
  model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
  common = dict(
    model=model,
    data=data,
    local_optimizer=optax.sgd(LR),
    schedule=LocalSchedule(batch_size=B, steps=2),
    **fields,
  )
  method = getattr(algorithms, name)
  poisson = method(sampling="poisson", poisson_q=0.5, cohort_size=9, **common)
  _, m = ref.run_jit(poisson, data, 1, jax.random.key(0))
  assert 0 <= int(m["clients_trained"]) <= 9
  systems = Systems(
    profile=make_profile(np.linspace(0.5, 4, data.num_clients), np.full(data.num_clients, 1e6)),
    policy=deadline(1.0, partial=True),
  )
  _, m = ref.run_jit(method(systems=systems, cohort_size=5, **common), data, 1, jax.random.key(0))
  assert "round_seconds" in m and int(m["clients_partial"]) > 0


def test_a_custom_update_needs_no_local_optimizer(problem):
  data, _ = problem
  model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
  algorithms.perfedavg(
    model=model, data=data, schedule=LocalSchedule(batch_size=B, steps=1), alpha=0.1, beta=0.1
  )
  with pytest.raises(ValueError, match="local_optimizer=None, but the default local training needs one"):
    fedavg(model=model, data=data, schedule=LocalSchedule(batch_size=B, steps=1))


# ------------------------------------------------------------------------ a pass before training
def test_a_gather_pass_reaches_the_clients_in_the_same_round(problem):
  """A server rule's pass before training (Mime's): every taking-part client sends its weight,
  ``prepare`` keeps their sum per parent, the training clients send back what their parent
  broadcasts, so each parent's ``receive`` sees ``reported · Σ w``; the inbox's population weight is
  every child's weight summed; both passes' messages count in the bytes; half a pass is refused."""
  from fedtree.core.local import ClientUpdate
  from fedtree.core.server_rule import Downlink, ServerRule

  data, groups = problem
  topo = Topology.from_labels(groups)
  model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
  zero = jnp.zeros((), jnp.float32)
  gather = ClientUpdate(apply=lambda a, s, d, n, k, rnd: (a, s, zero, rnd.weight), takes_round=True)
  echo = ClientUpdate(apply=lambda a, s, d, n, k, rnd: (a, s, zero, rnd.broadcast), takes_round=True)
  rule = ServerRule(init=lambda p, n: jnp.zeros((n,), jnp.float32), name="echo",
                    down=Downlink(gather=gather, prepare=lambda inbox, state: inbox.messages),
                    receive=lambda inbox, state: (inbox.pseudo_gradient, inbox.messages,
                                                  {"population_weight": inbox.population_weight}))
  alg = hierfavg(model=model, topology=topo, data=data, schedule=LocalSchedule(batch_size=B, steps=1),
                 cohort_size=2, weighting="examples", client_update=echo, server_rule=rule)
  key = jax.random.key(5)
  state, metrics = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, key)
  n = np.asarray(data.n_train, np.float64)
  parent = topo.parent(2)
  cohort = cohort_sampler(parent, 2)(stream(key, "cohort"))
  picked = np.bincount(np.asarray(cohort.parent)[np.asarray(cohort.valid)],
                       weights=n[np.asarray(cohort.clients)[np.asarray(cohort.valid)]], minlength=3)
  np.testing.assert_allclose(np.asarray(state.server_state), 2 * picked, rtol=1e-6)
  every = np.bincount(parent, weights=n).mean()
  np.testing.assert_allclose(float(metrics["population_weight"]), every, rtol=1e-6)
  size = sum(int(np.prod(np.shape(p))) * 4 for p in jax.tree.leaves(model.init(jax.random.key(0))))
  assert (float(metrics["uplink_bytes"]), float(metrics["downlink_bytes"])) == (size + 8, size + 4)
  with pytest.raises(ValueError, match="server rule 'echo' gives only one of gather and prepare"):
    hierfavg(model=model, topology=topo, data=data, schedule=LocalSchedule(batch_size=B, steps=1),
             client_update=echo, server_rule=rule._replace(down=rule.down._replace(prepare=None)))
  with pytest.raises(ValueError, match="gather pass must take the round"):
    hierfavg(model=model, topology=topo, data=data, schedule=LocalSchedule(batch_size=B, steps=1),
             client_update=echo,
             server_rule=rule._replace(down=rule.down._replace(gather=gather._replace(takes_round=False))))
