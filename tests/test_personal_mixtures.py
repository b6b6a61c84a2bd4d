"""APFL, FedALA, FedEM and kNN-Per from run configs (issue 38): bad values refused before anything
compiles, naming the run and the value; FedEM's components and kNN-Per's memory in the up-front
memory estimate and refused with the numbers when they do not fit; their float hyperparameters as
sweep axes equal to the runs done alone."""

import jax
import ml_collections
import numpy as np
import pytest
from helpers import ALGORITHM_CASES, small_context
from test_sweep import alone, assert_same, swept, tiny

from fedtree import experiment
from fedtree.core import loop
from fedtree.core import sweep as stacked
from fedtree.experiment import memory, registry, runner


@pytest.fixture(scope="module")
def ctx():
  return small_context()


@pytest.mark.parametrize("fields,match", [
  ({"algorithm": "fedem", "num_components": 0},
   r"config.runs.x \(algorithm='fedem'\): num_components=0 must be an int >= 1"),
  ({"algorithm": "knnper", "k": 0}, r"config.runs.x \(algorithm='knnper'\): k=0 must be an int >= 1"),
  ({"algorithm": "knnper", "lam": 1.2}, r"\(algorithm='knnper'\): lam=1.2 must be in \[0, 1\]"),
  ({"algorithm": "apfl", "alpha": 1.5}, r"config.runs.x \(algorithm='apfl'\): alpha=1.5 must be in \[0, 1\]"),
  ({"algorithm": "apfl", "alpha": -0.5}, r"\(algorithm='apfl'\): alpha=-0.5 must be in \[0, 1\]"),
  ({"algorithm": "apfl", "alpha_schedule": "often"},
   r"config.runs.x \(algorithm='apfl'\): alpha_schedule='often'; choose one of"),
  ({"algorithm": "fedala", "layers": 7}, r"config.runs.x \(algorithm='fedala'\): layers=7: the model has 2"),
  ({"algorithm": "fedala", "layer": 1}, r"config.runs.x \(algorithm='fedala'\): unknown field 'layer' "
                                         r"\(did you mean 'layers'\?\)"),
  ({"algorithm": "fedem", "num_component": 2}, "did you mean 'num_components'"),
])
def test_bad_values_are_refused_by_run_and_value(ctx, fields, match):
  with pytest.raises(ValueError, match=match):
    registry.build_algorithm("x", ml_collections.ConfigDict(fields), ctx)


def _config(run: dict, rounds: int = 2):
  c = tiny(runs=("fedavg",), rounds=rounds)
  c.checkpoint_every = 0
  c.runs = ml_collections.ConfigDict({"m": run})
  c.run_order = ("m",)
  return c


@pytest.mark.parametrize("run,part,models", [
  ({"algorithm": "fedem", "num_components": 10}, r"FedEM's 10 components at 1 node\(s\) \d+ bytes", 10),
  ({"algorithm": "knnper", "k": 3},
   r"kNN-Per's memory \(5 clients x \d+ examples x 64 features\) \d+ bytes", 1),
])
def test_components_and_memories_are_in_the_memory_estimate(run, part, models):
  c = _config(run)
  c.model.hidden = (64,)   # a state of the size of the clients' data
  ctx = runner.make_context(c)
  alg = registry.build_algorithm("m", c.runs.m, ctx)
  needs = registry.memory_needs("m", c.runs.m, ctx)
  assert needs.step_models == models and needs.eval_models == models
  (what, size), = needs.parts
  state = memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
  assert 0 < size < state   # a named part of the state
  line = memory.check_memory("m", state_bytes=state, step_bytes=100, chunk=2, limit=None, source="test",
                             needs=needs)
  assert what in line and (f"({models} models)" in line) == (models > 1)
  data = memory.tree_bytes(ctx.data)
  c.memory_limit_bytes = 2 * data + state // 2   # the data fits (twice on CPU), the state beside it not
  with pytest.raises(ValueError, match=rf"run 'm' does not fit in memory: state {state} bytes "
                                       rf"\(of which {part}\)"):
    experiment.train_and_evaluate(c, None)


@pytest.mark.parametrize("run,params", [
  ({"algorithm": "apfl"}, {"alpha": [0.2, 0.7], "alpha_lr": [0.01, 0.1], "alpha_decay": [0.0, 0.02]}),
  ({"algorithm": "fedala"}, {"eta": [0.5, 1.0], "sample_fraction": [0.5, 1.0], "threshold": [0.1, 0.2]}),
  ({"algorithm": "knnper"}, {"lam": [0.2, 0.9], "temperature": [0.5, 2.0]}),
])
def test_float_hyperparameters_trace_as_sweep_axes(run, params):
  """Every float hyperparameter reaches init and round as a traced value (no compile: traced abstractly)."""
  c = _config(run)
  ctx = runner.make_context(c)
  hp = {f"runs.m.{k}": v for k, v in params.items()}
  build = experiment.sweep.config_builder(c, "m", ctx, registry.build_algorithm)
  alg = stacked.sweep(build, hp, [0, 0])
  state = jax.eval_shape(alg.init, jax.random.key(0))
  new, _ = jax.eval_shape(alg.round, state, ctx.data, jax.random.key(1))
  assert jax.tree.structure(new) == jax.tree.structure(state)


@pytest.mark.slow
def test_apfl_alpha_sweep_equals_the_runs_done_alone():
  c = _config({"algorithm": "apfl", "cohort_size": 3}, rounds=2)
  c.sweep.params = "runs.m.alpha=0.2,0.7"
  exps, st = swept(c, "m")
  finals = [stacked.experiment(st, e) for e in range(len(exps))]
  for e, (setting, seed) in enumerate(exps):
    assert_same(finals[e], alone(c, "m", seed, setting))
  a, b = (np.asarray(f.client_state.alpha) for f in finals)
  assert not np.allclose(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("run,params", [
  ({"algorithm": "fedala", "cohort_size": 3, "max_ala_epochs": 12}, "runs.m.eta=0.5,1.0"),
  ({"algorithm": "knnper", "k": 3}, "runs.m.lam=0.2,0.9"),
])
def test_float_hyperparameters_sweep(run, params):
  c = _config(run, rounds=2)
  c.sweep.params = params
  exps, st = swept(c, "m")
  for e, (setting, seed) in enumerate(exps):
    assert_same(stacked.experiment(st, e), alone(c, "m", seed, setting))


@pytest.mark.parametrize("name", ["apfl", "fedala", "fedem", "knnper"])
def test_on_the_configs_tree_every_client_personalizes_with_its_leaf_parent(ctx, name):
  """(Traced abstractly: no compile; the slow tests run them on trees against their references.)"""
  run = ml_collections.ConfigDict({"algorithm": name, **ALGORITHM_CASES[name], "tree": "config",
                                   "periods": (2,), "cohort_size": 2})
  alg = registry.build_algorithm("x", run, ctx)
  state = alg.init(jax.random.key(0))
  new, metrics = jax.eval_shape(alg.round, state, ctx.data, jax.random.key(1))
  assert jax.tree.structure(new) == jax.tree.structure(state) and "level0_children_sent" in metrics
  models = alg.models(state)
  owner = np.asarray(models["personal"].model_of_client)
  rows = jax.tree.leaves(models["personal"].params)[0].shape[0]
  edges = ctx.topology.ancestor(1)
  if rows == ctx.data.num_clients:   # a model per client (APFL's mixtures, FedALA's local models)
    assert owner.tolist() == list(range(rows))
  else:                              # the leaf parents' models, with every client's own inputs
    assert rows == ctx.topology.num_nodes(1) and owner.tolist() == edges.tolist()
  assert "global" in models


def test_fine_tuning_leaves_the_sets_scored_by_their_own_model(ctx):
  """X + FT fine-tunes kNN-Per's global model, not its memory-scored ``personal`` set; naming a
  ScoredModels set, or FedEM (every set of it is one), is refused naming the sets."""
  def models(name, **fields):
    run = ml_collections.ConfigDict({"algorithm": name, **ALGORITHM_CASES[name], **fields})
    alg = registry.build_algorithm("x", run, ctx)
    return jax.eval_shape(alg.models, alg.init(jax.random.key(0)))

  assert sorted(models("knnper", finetune_steps=2)) == ["global", "global_ft", "personal"]
  with pytest.raises(ValueError, match=r"finetune_models=\['personal'\] names \['personal'\], scored by a "
                                       r"model of their own.*fine-tune one of \['global'\]"):
    models("knnper", finetune_steps=2, finetune_models="personal")
  with pytest.raises(ValueError, match=r"fedem: every model it reports \['global', 'personal'\] is scored "
                                       r"by a model of its own.*nothing to fine-tune"):
    models("fedem", finetune_steps=2)
