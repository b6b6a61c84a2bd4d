"""Every registered algorithm through the same invariants (as optax's common optimizer tests):
built from a run config by the registry on one tiny shared problem, its round compiles once
over several rounds, its metrics are finite, ``models()`` has the promised shapes, a seed
fixes the result, and a run resumed from a host copy of the state equals an unbroken one.
Then every objective x algorithm composition either traces or is refused with a
``ValueError`` that names the algorithm.
"""

import dataclasses

import jax
import ml_collections
import numpy as np
import optax
import pytest
from helpers import ALGORITHM_CASES, count_traces, host_copy, small_context, trees_equal

from fedtree import algorithms
from fedtree.core.local import LocalSchedule, sgd_client_update
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.experiment import registry
from fedtree.models import build_model
from fedtree.objectives import (
  alo_update,
  ditto_update,
  fedprox_update,
  moreau_client_update,
  perfedavg_update,
  pfedme_update,
)

LR, B, STEPS = 0.05, 4, 2

CASES = ALGORITHM_CASES


@pytest.fixture(scope="module")
def ctx():
  return small_context()


def _build(ctx, name, **fields):
  run = ml_collections.ConfigDict({"algorithm": name, "chunk_size": 3, **CASES[name], **fields})
  built = registry.build_algorithm(name, run, ctx)
  return built


def test_every_registered_algorithm_has_a_case():
  assert set(CASES) == set(registry.SPECS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_conformance(ctx, name):
  alg = _build(ctx, name)
  assert isinstance(alg, algorithms.FederatedAlgorithm)
  counted, traces = count_traces(alg)
  step = jax.jit(counted.round)
  root = jax.random.key(3)

  def run(state, rounds):
    for _ in range(rounds):
      state, metrics = step(state, ctx.data, jax.random.fold_in(root, state.round))
      for k, v in metrics.items():
        assert np.all(np.isfinite(np.asarray(v))), f"{name}: metric {k}={v}"
    return state

  straight = run(alg.init(jax.random.key(0)), 4)
  assert len(traces) == 1, f"{name}: round traced {len(traces)} times in 4 rounds"
  assert int(straight.round) == 4

  # deterministic for a seed; resumable from a host copy of the state (a checkpoint)
  trees_equal(run(alg.init(jax.random.key(0)), 4), straight)
  half = host_copy(run(alg.init(jax.random.key(0)), 2))
  trees_equal(run(half, 2), straight)
  assert len(traces) == 1, f"{name}: a resumed state re-traced the round ({len(traces)} traces)"

  # models(): [N, ...] params, int32[C] model_of_client in range
  c = ctx.data.num_clients
  models = alg.models(straight)
  assert models, f"{name}: models() is empty"
  for model_name, m in models.items():
    n = {np.shape(p)[0] for p in jax.tree.leaves(m.params)}
    assert len(n) == 1, f"{name}/{model_name}: leaves disagree on N: {n}"
    moc = np.asarray(m.model_of_client)
    assert moc.shape == (c,) and np.issubdtype(moc.dtype, np.integer), (model_name, moc)
    assert moc.min() >= 0 and moc.max() < n.pop(), f"{name}/{model_name}: model_of_client out of range"
    for p in jax.tree.leaves(m.params):
      assert np.all(np.isfinite(np.asarray(p))), f"{name}/{model_name}: non-finite params"


STREAMS = {"fedavg", "hierfavg", "scaffold", "ditto", "fedper", "apfl", "fedrod", "heterofl", "depthfl"}
"""Algorithms a streamed population must serve (issue 49): the test below checks they still say which
clients a round reads."""


@pytest.mark.slow   # (47 algorithms, each round compiled over the population and over a window: 2 min)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_round_over_a_window_of_its_clients_is_the_resident_round(ctx, name):
  """Issue 49 over the harness: every registered algorithm either says it cannot stream (``reads`` None:
  it reads clients beyond its cohort), or computes over a window holding only the clients its rounds
  read (in rows that are not their ids, with padding) bitwise the resident rounds, its per-client rows
  outside the window untouched; and the per-client model sets it makes for those clients
  (``ClientModels``) are the resident sets' rows of those clients."""
  from fedtree.core.window import unwindow_state, window_data, window_of, window_state

  alg = _build(ctx, name)
  if alg.reads is None:
    assert name not in STREAMS, f"{name} no longer says which clients a round reads"
    return
  data, c = ctx.data, ctx.data.num_clients
  step = jax.jit(alg.round)
  root = jax.random.key(7)
  full = resident = alg.init(jax.random.key(0))
  for _ in range(2):
    key = jax.random.fold_in(root, full.round)
    read = np.unique(np.asarray(alg.reads.clients(full, key)))
    rows, valid, window = window_of(read, c, size=len(read) + 2)
    new, metrics = step(window_state(full, rows), window_data(data, rows, window), key)
    full = unwindow_state(full, new, rows, valid)
    resident, want = step(resident, data, key)
    trees_equal(full, resident)
    trees_equal(metrics, want)
  cm = alg.client_sets()
  if cm is None:
    return
  every = alg.models(resident)
  made = cm.sets(window_state(resident, rows[valid]), rows[valid])
  for set_name, got in made.items():
    ref = every[set_name]
    at = np.asarray(ref.model_of_client)[rows[valid]]
    trees_equal(jax.tree.map(lambda a: np.asarray(a)[np.asarray(got.model_of_client)], got.params),  # noqa: B023
                jax.tree.map(lambda a: np.asarray(a)[at], ref.params))  # noqa: B023
    if getattr(ref, "client_params", None) is not None:
      trees_equal(got.client_params, jax.tree.map(lambda a: np.asarray(a)[rows[valid]], ref.client_params))  # noqa: B023


def test_misspelled_field_names_the_run_and_the_allowed_fields(ctx):
  run = ml_collections.ConfigDict({"algorithm": "fedprox", "mu": 0.1, "cohrt_size": 2})
  with pytest.raises(ValueError, match=r"config.runs.prox \(algorithm='fedprox'\): unknown field "
                                       r"'cohrt_size' \(did you mean 'cohort_size'\?\); allowed fields: "):
    registry.build_algorithm("prox", run, ctx)
  config = ml_collections.ConfigDict({"runs": {"x": {"algorithm": "ifca", "num_clusters": 2,
                                                     "nm_clusters": 2}}})
  with pytest.raises(ValueError, match="did you mean 'num_clusters'"):
    registry.validate_runs(config)


def test_fields_are_coerced_and_required_ones_named(ctx):
  kw = registry.factory_kwargs("a", ml_collections.ConfigDict(
    {"algorithm": "awcfl", "num_clusters": 2.0, "beta": 1, "cohort_size": -1}), ctx)
  assert kw["num_clusters"] == 2 and isinstance(kw["num_clusters"], int)
  assert kw["beta"] == 1.0 and isinstance(kw["beta"], float)
  assert kw["cohort_size"] is None
  with pytest.raises(ValueError, match=r"num_clusters=2.5; it must be an integer"):
    registry.factory_kwargs("a", ml_collections.ConfigDict({"algorithm": "ifca", "num_clusters": 2.5}), ctx)
  with pytest.raises(ValueError, match=r"config.runs.d \(algorithm='ditto'\) needs field\(s\) \['lam'\]"):
    registry.factory_kwargs("d", ml_collections.ConfigDict({"algorithm": "ditto"}), ctx)
  with pytest.raises(ValueError, match="tree='deep'; choose one of"):
    registry.factory_kwargs("p", ml_collections.ConfigDict({"algorithm": "fedprox", "mu": 0.1,
                                                            "tree": "deep"}), ctx)


def test_swept_jax_values_pass_through_unchecked_when_traced(ctx):
  """Sweeps (vmap over a hyperparameter) hand the registry jax scalars, possibly tracers."""
  from fedtree.core.checks import check_positive

  mu = jax.numpy.float32(0.25)
  kw = registry.factory_kwargs("p", ml_collections.ConfigDict({"algorithm": "fedprox", "mu": mu}), ctx)
  assert kw["mu"] is mu

  def traced(v):
    assert registry.coerce(v, float, "mu") is v
    check_positive(mu=v)  # a tracer is skipped (it was checked concretely before tracing)
    return v

  np.testing.assert_allclose(jax.vmap(traced)(jax.numpy.asarray([-1.0, 2.0])), [-1.0, 2.0])
  with pytest.raises(ValueError, match="mu=-1.0 must be a finite number > 0"):
    check_positive(mu=-1.0)


# ------------------------------------------------------------------------ compositions
def _objectives(ctx, compute_dtype=None):
  m, opt, mx = ctx.model, ctx.local_optimizer, ctx.schedule.max_steps(ctx.data.max_train)
  kw = dict(batch_size=B, max_steps=mx, compute_dtype=compute_dtype)
  return {
    "plain": sgd_client_update(m, opt, **kw),
    "plain_own": sgd_client_update(m, opt, persistent=True, **kw),
    "fedprox": fedprox_update(m, opt, mu=0.1, **kw),
    "fedprox_own": fedprox_update(m, opt, mu=0.1, persistent=True, **kw),
    "ditto": ditto_update(m, opt, lam=0.5, **kw),
    "pfedme": pfedme_update(m, lam=5.0, inner_steps=2, personal_lr=0.05, learning_rate=LR, **kw),
    "perfedavg": perfedavg_update(m, alpha=0.05, beta=0.05, **kw),
    "alo": alo_update(m, opt, mu=0.2, lam=0.001, **kw),
    "moreau": moreau_client_update(m, learning_rate=LR, lam=5.0, **kw),
  }


HOSTS = ("fedavg", "hierfavg", "bhfl", "cfl", "ifca", "awcfl", "mcfl", "pfedmt")
STATEFUL = ("plain_own", "fedprox_own", "ditto", "pfedme", "alo", "moreau")
# What must be refused, and why (the message must name the algorithm).
REFUSED = {
  **{("bhfl", o): "starts from the downloaded model" for o in
     ("plain", "fedprox", "ditto", "pfedme", "perfedavg", "alo", "moreau")},
  **{(a, o): "must be stateless" for a in ("cfl", "ifca", "awcfl", "mcfl") for o in STATEFUL},
}


def _factory_kwargs(ctx, name):
  return registry.factory_kwargs(name, ml_collections.ConfigDict({"algorithm": name, **CASES[name]}), ctx)


def _host(ctx, name, update):
  """Algorithm ``name`` (its conformance case) with ``update`` as the clients' objective."""
  return registry.SPECS[name].factory(**_factory_kwargs(ctx, name), client_update=update)


def _traces(alg, ctx):
  """The round traces (abstractly: no compile) and keeps the state's structure."""
  state = jax.eval_shape(alg.init, jax.random.key(0))
  new, metrics = jax.eval_shape(alg.round, state, ctx.data, jax.random.key(1))
  assert jax.tree.structure(new) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state), strict=True):
    assert (a.shape, a.dtype) == (b.shape, b.dtype)
  return metrics


@pytest.mark.parametrize("host", HOSTS)
def test_every_objective_runs_or_is_refused(ctx, host):
  for obj, update in _objectives(ctx).items():
    why = REFUSED.get((host, obj))
    if why is not None:
      with pytest.raises(ValueError, match=why) as err:
        _host(ctx, host, update)
      assert host in str(err.value), err.value
    else:
      _traces(_host(ctx, host, update), ctx)


@pytest.mark.parametrize("name", ["fedavg", "hierfavg", "fedprox", "ditto", "pfedme", "perfedavg",
                                  "pfedmt", "bhfl", "cfl", "ifca", "awcfl", "mcfl", "fedkws", "grouppfl",
                                  "fedmmd", "scaffold", "feddyn", "fednova", "mime", "mimelite",
                                  "apfl", "fedala", "fedem", "knnper"])
def test_compute_dtype_combines_with_every_algorithm(ctx, name):
  """``compute_dtype`` reaches every objective: the round traces with bfloat16 in it."""
  alg = _build(ctx, name, compute_dtype="bfloat16")
  state = alg.init(jax.random.key(0))
  jaxpr = str(jax.make_jaxpr(alg.round)(state, ctx.data, jax.random.key(1)))
  assert "bf16" in jaxpr, f"{name}: compute_dtype did not reach local training"


def test_objectives_with_compute_dtype_compose():
  """An explicit objective plus an algorithm-level compute_dtype is refused, not ignored."""
  data, groups = grouped_synthetic(group_sizes=(2,), dim=3, num_classes=2, mean_examples=4,
                                   min_examples=2, max_examples=5, test_examples=2, seed=0)
  model = build_model("logreg", example_shape=data.example_shape, num_classes=2)
  sched = LocalSchedule(batch_size=2, steps=1)
  update = fedprox_update(model, optax.sgd(0.1), mu=0.1, batch_size=2, max_steps=1)
  with pytest.raises(ValueError, match="pass compute_dtype to the objective's factory"):
    algorithms.fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1), schedule=sched,
                      client_update=update, compute_dtype="bfloat16")


def test_fedprox_clients_learn_under_bhfl(ctx):
  """DESIGN.md's example: FedProx clients under B-HFL (they start from their own models)."""
  mx = ctx.schedule.max_steps(ctx.data.max_train)
  update = fedprox_update(ctx.model, ctx.local_optimizer, mu=0.1, batch_size=B, max_steps=mx,
                          persistent=True)
  alg = algorithms.bhfl(model=ctx.model, topology=ctx.topology, data=ctx.data,
                        local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
                        client_update=update, chunk_size=None)
  s0 = alg.init(jax.random.key(0))
  s = s0
  for r in range(2):
    s, _ = alg.round(s, ctx.data, jax.random.key(r))
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max())
           for a, b in zip(jax.tree.leaves(s.params), jax.tree.leaves(s0.params), strict=True)]
  assert min(moved) > 0.0, moved


def test_personal_models_come_from_the_objective(ctx):
  """``models()`` shows ``personal`` exactly when the objective declares personal models."""
  for obj, update in _objectives(ctx).items():
    alg = _host(ctx, "hierfavg", update)
    names = set(alg.models(alg.init(jax.random.key(0))))
    assert ("personal" in names) == (update.personal_models is not None), (obj, names)


# Their models() compute eagerly at init (adapted models, cluster features, mixed clusters):
# seconds on a busy CPU, so they run with -m slow.
INIT_SLOW = ("awcfl", "mcfl", "perfedavg")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in INIT_SLOW else n
                                  for n in sorted(registry.SPECS)])
def test_init_params_is_the_start(ctx, name):
  """Every registered algorithm starts from the context's ``init_params`` (``config.init_params``)."""
  run = ml_collections.ConfigDict({"algorithm": name, **CASES.get(name, {})})
  ctx = ctx.for_run(run)   # (a case with a model of its own, FedBN's, starts from that model's parameters)
  p = ctx.model.init(jax.random.key(42))
  built = registry.build_algorithm(name, run, dataclasses.replace(ctx, init_params=p))
  alg = getattr(built, "algorithm", built)
  if "adapters" in run:   # a run of adapters starts from fresh adapters on init_params, its frozen base
    trees_equal(alg.init(jax.random.key(0)).base, p)
    return
  first = next(iter(alg.models(alg.init(jax.random.key(0))).values())).params
  row = jax.tree.map(lambda a: a[0], first)
  if isinstance(row, dict) and "body" in row:   # DepthFL: the model with exit heads; its body is the model
    row = row["body"]
  if jax.tree.leaves(row)[0].ndim > jax.tree.leaves(p)[0].ndim:   # a row of stacked components (FedEM):
    row = jax.tree.map(lambda a: a[0], row)                        # the first one starts from p
  trees_equal(row, p)



def test_objective_is_selectable_from_a_run_config(ctx):
  """``objective: {name, **hyperparameters}`` puts a local objective under any host that takes a
  ``client_update``: FedProx under FedAvg from a config is FedProx; under B-HFL the objective
  is built from the client's own model and with the run's compute_dtype (the host gets none)."""
  common = dict(model=ctx.model, data=ctx.data, local_optimizer=ctx.local_optimizer, schedule=ctx.schedule,
                chunk_size=3)
  built = registry.build_algorithm("x", ml_collections.ConfigDict(
    {"algorithm": "fedavg", "chunk_size": 3, "objective": {"name": "fedprox", "mu": 0.1}}), ctx)
  direct = algorithms.fedprox(mu=0.1, **common)
  a, _ = jax.jit(built.round)(built.init(jax.random.key(0)), ctx.data, jax.random.key(1))
  b, _ = jax.jit(direct.round)(direct.init(jax.random.key(0)), ctx.data, jax.random.key(1))
  trees_equal(a.params, b.params)
  kw = registry.factory_kwargs("x", ml_collections.ConfigDict(
    {"algorithm": "bhfl", "compute_dtype": "bfloat16",
     "objective": {"name": "fedprox", "mu": 0.1, "persistent": True}}), ctx)
  assert kw["client_update"].starts_from_own_model and kw.get("compute_dtype") is None
  state = jax.eval_shape(algorithms.bhfl(**kw).init, jax.random.key(0))
  assert "bf16" in str(jax.make_jaxpr(algorithms.bhfl(**kw).round)(state, ctx.data, jax.random.key(1)))
  for fields, match in [
    ({"algorithm": "fedavg", "objective": {"name": "prox"}}, r"objective name='prox'; choose one of \['alo'"),
    ({"algorithm": "fedavg", "objective": {"name": "fedprox", "muu": 0.1}}, "did you mean 'mu'"),
    ({"algorithm": "fedavg", "objective": {"name": "fedprox"}},
     r"objective 'fedprox' needs field\(s\) \['mu'\]"),
    ({"algorithm": "fedprox", "mu": 0.1, "objective": {"name": "ditto"}}, "unknown field 'objective'"),
    ({"algorithm": "bhfl", "objective": {"name": "fedprox", "mu": 0.1}}, "starts from the downloaded model"),
    ({"algorithm": "fedavg", "objective": {"name": "alo", "private": "head"}},
     "private='head' .* through the fedkws algorithm"),
  ]:
    with pytest.raises(ValueError, match=match):
      registry.build_algorithm("x", ml_collections.ConfigDict(fields), ctx)


def test_registry_restates_no_factory_default(ctx):
  """A run that sets nothing gets the factory's (or GroupPersonalizedFL's) defaults: the
  converters pass only what the run gives."""
  kw = registry.factory_kwargs("b", ml_collections.ConfigDict({"algorithm": "bhfl"}), ctx)
  assert not {"down_optimizers", "proxy", "proxy_schedule", "residual_optimizer", "residual_down_optimizer",
              "latencies", "buffer_sizes"} & set(kw)
  kw = registry.factory_kwargs("b", ml_collections.ConfigDict(
    {"algorithm": "bhfl", "proxy_examples": 4, "proxy_levels": (0,), "proxy_steps": 3}), ctx)
  assert set(kw["proxy"]) == {0} and kw["proxy_schedule"].steps == 3
  assert kw["proxy_schedule"].batch_size == ctx.schedule.batch_size
  with pytest.raises(ValueError, match="proxy_examples=4 needs proxy_levels"):
    registry.factory_kwargs("b", ml_collections.ConfigDict({"algorithm": "bhfl", "proxy_examples": 4}), ctx)
  spec = registry.SPECS["grouppfl"].factory(**registry.factory_kwargs(
    "g", ml_collections.ConfigDict({"algorithm": "grouppfl", "finetune": {"epochs": 2}}), ctx))
  assert (spec.group_rounds, spec.cohort_size, spec.finetune_epochs) == (0, None, 2)
  assert spec.finetune_rates == (0.001, 0.01, 0.1, 1.0) and spec.finetune_optimizer == "sgd"
  with pytest.raises(ValueError, match="finetune_epochs=0 .K_l. must be > 0"):
    registry.build_algorithm("g", ml_collections.ConfigDict({"algorithm": "grouppfl",
                                                             "finetune": {"epochs": 0}}), ctx)
