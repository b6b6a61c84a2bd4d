"""fedtree.experiment.memory: a run's (or a sweep chunk's) memory is stated and checked before
anything compiles, naming the largest chunk that fits."""

import jax
import pytest
from helpers import hierfavg_config

from fedtree import experiment
from fedtree.core import loop


def test_a_run_that_cannot_fit_fails_before_compiling_with_the_largest_chunk_that_fits(capsys):
  from fedtree.experiment import memory, runner

  c = hierfavg_config(rounds=2)
  c.checkpoint_every = 0
  c.runs.hierfavg.chunk_size = 6
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  budget = memory.Budget.of(ctx)
  state = memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
  step = budget.step_bytes()
  assert state > 0 and step > 0
  c.memory_limit_bytes = state + int(2.5 * step)  # the state and 2 clients' steps fit, not 6
  with pytest.raises(ValueError, match=rf"run 'hierfavg' does not fit in memory: state {state} bytes "
                                       rf"\+ chunk working set {6 * step} bytes \(chunk_size=6\).*"
                                       r"config.memory_limit_bytes\); set chunk_size <= 2"):
    experiment.train_and_evaluate(c, None)
  c.memory_limit_bytes = state // 2
  with pytest.raises(ValueError, match="even the smallest chunk does not fit"):
    experiment.train_and_evaluate(c, None)
  line = memory.check_memory("x", state_bytes=state, step_bytes=step, chunk=2, limit=state + 3 * step,
                             source="test")
  assert line.startswith("x: memory estimate ") and "chunk working set 2 x" in line


def test_a_sweep_that_cannot_fit_names_the_experiments_per_chunk_that_fit():
  from fedtree.experiment import memory, runner

  c = hierfavg_config(rounds=2)
  c.checkpoint_every = 0
  c.runs.hierfavg.chunk_size = 3
  c.sweep.seeds = 4
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  one = (memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
         + 3 * memory.Budget.of(ctx).step_bytes())
  c.memory_limit_bytes = int(2.5 * one)  # 2 experiments of the 4 fit
  with pytest.raises(ValueError, match=r"\(chunk_size=3, 4 experiments at once\).*; set sweep.chunk <= 2"):
    experiment.train_and_evaluate(c, None)
