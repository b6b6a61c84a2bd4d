"""FedAMP, FedFomo, pFedHN and FedProto from run configs (issue 38): their work over a round's cohort
in the up-front memory estimate and refused with the numbers when it does not fit; every float
hyperparameter a sweep axis (traced), a sweep equal to the runs done alone; every method on the
config's tree."""

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

METHODS = ("fedamp", "fedfomo", "pfedhn", "fedproto")


def _config(run: dict, rounds: int = 2):
  c = tiny(runs=("fedavg",), rounds=rounds)
  c.checkpoint_every = 0
  c.runs = ml_collections.ConfigDict({"m": run})
  c.run_order = ("m",)
  return c


@pytest.mark.parametrize("run,what", [
  ({"algorithm": "fedamp", "cohort_size": 4},
   r"FedAMP's cohort blocks and cloud models \(4 slots, 1 x 4 blocks\)"),
  ({"algorithm": "fedfomo", "num_candidates": 2, "cohort_size": 4},
   r"FedFomo's candidate models \(4 clients x 2\)"),
  ({"algorithm": "pfedhn", "cohort_size": 3, "hidden": 4},
   r"pFedHN's generated and returned models \(3 slots"),
])
def test_cohort_buffers_are_in_the_memory_estimate(run, what):
  c = _config(run)
  c.model.hidden = (64,)   # buffers over twice the clients' data, which is checked first (twice on CPU)
  ctx = runner.make_context(c)
  alg = registry.build_algorithm("m", c.runs.m, ctx)
  needs = registry.memory_needs("m", c.runs.m, ctx)
  held = sum(n for _, n in needs.cohort)
  one = memory.tree_bytes(jax.eval_shape(ctx.model.init, jax.random.key(0)))
  assert held >= 3 * one   # at least a model per slot
  state = memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
  line = memory.check_memory("m", state_bytes=state, step_bytes=100, chunk=2, limit=None, source="test",
                             needs=needs)
  assert needs.cohort[0][0] in line
  data = memory.tree_bytes(ctx.data)
  assert held > 2 * data
  c.memory_limit_bytes = 2 * data + state + held // 2   # the data and the state fit, the cohort's not
  with pytest.raises(ValueError, match=rf"run 'm' does not fit in memory: its work over every parent's "
                                       rf"cohort holds {what}.*sample fewer clients per parent a round "
                                       rf"\(cohort_size\)"):
    experiment.train_and_evaluate(c, None)


@pytest.mark.parametrize("run,params", [
  ({"algorithm": "fedamp"}, {"alpha": [0.5, 1.0], "lam": [0.0, 1.0], "sigma": [1.0, 2.0],
                             "self_attention": [0.3, 0.6]}),
  ({"algorithm": "fedfomo", "num_candidates": 1}, {"epsilon": [0.0, 0.5], "epsilon_decay": [0.0, 0.1],
                                                   "val_fraction": [0.2, 0.4]}),
  ({"algorithm": "pfedhn", "hidden": 4}, {"hn_learning_rate": [0.01, 0.1], "hn_momentum": [0.0, 0.9],
                                          "hn_weight_decay": [0.0, 1e-3], "clip_norm": [1.0, 50.0]}),
  ({"algorithm": "fedproto"}, {"lam": [0.0, 1.0]}),
])
def test_float_hyperparameters_trace_as_sweep_axes(run, params):
  """Every float hyperparameter reaches init and round as a traced value (traced abstractly: no compile)."""
  c = _config(run)
  ctx = runner.make_context(c)
  hp = {f"runs.m.{k}": v for k, v in params.items()}
  build = experiment.sweep.config_builder(c, "m", ctx, registry.build_algorithm)
  alg = stacked.sweep(build, hp, [0, 0])
  state = jax.eval_shape(alg.init, jax.random.key(0))
  new, _ = jax.eval_shape(alg.round, state, ctx.data, jax.random.key(1))
  assert jax.tree.structure(new) == jax.tree.structure(state)


@pytest.mark.slow
@pytest.mark.parametrize("run,params", [
  ({"algorithm": "fedamp", "attention": "cosine", "cohort_size": 3}, "runs.m.lam=0.0,1.0"),
  ({"algorithm": "fedproto", "cohort_size": 3}, "runs.m.lam=0.0,2.0"),
])
def test_float_hyperparameters_sweep(run, params):
  c = _config(run, rounds=2)
  c.sweep.params = params
  exps, st = swept(c, "m")
  finals = [stacked.experiment(st, e) for e in range(len(exps))]
  for e, (setting, seed) in enumerate(exps):
    assert_same(finals[e], alone(c, "m", seed, setting))
  assert not np.allclose(np.asarray(jax.tree.leaves(finals[0].personal or finals[0].client_state)[0]),
                         np.asarray(jax.tree.leaves(finals[1].personal or finals[1].client_state)[0]))


@pytest.mark.parametrize("name", METHODS)
def test_on_the_configs_tree_every_client_is_paired_within_its_parent(name):
  """(Traced abstractly: no compile; the slow tests run them on trees against their references.)"""
  ctx = small_context()
  run = ml_collections.ConfigDict({"algorithm": name, **ALGORITHM_CASES[name], "tree": "config",
                                   "periods": (2,), "cohort_size": 2})
  if name == "fedfomo":
    run.num_candidates = 1
  alg = registry.build_algorithm("x", run, ctx)
  state = jax.eval_shape(alg.init, jax.random.key(0))
  new, metrics = jax.eval_shape(alg.round, state, ctx.data, jax.random.key(1))
  assert jax.tree.structure(new) == jax.tree.structure(state)
  models = alg.models(alg.init(jax.random.key(0)))
  assert sorted(models) == ["personal"]
  owner = np.asarray(models["personal"].model_of_client)
  assert owner.tolist() == list(range(ctx.data.num_clients))   # every client its own model
