"""Divergence of the state itself (issue 27 item 1): a state that explodes but stays finite (a
server learning rate of 1e30) stops the run the round it happens, naming the node, before it is
checkpointed; a checkpoint holding such a state is not resumed; the bound is configurable."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from config_files import load_config

from fedtree import experiment
from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, TreeState
from fedtree.experiment.checkpoint import Checkpointer, CheckpointError


def _exploding(bad_round=3, level=1, node=2, value=1e30):
  """A model-free algorithm on a 2-level state whose ``node`` of ``level`` jumps to ``value``
  (finite) in round ``bad_round``."""

  def init(key):
    del key
    return TreeState(round=jnp.zeros((), jnp.int32), params=(jnp.zeros((1, 3)), jnp.zeros((4, 3))),
                     opt_state=((), ()))

  def round_fn(state, data, key):
    params = [p + 0.1 * jax.random.normal(key, p.shape) for p in state.params]
    hit = state.round + 1 == bad_round
    params[level] = params[level].at[node, 0].set(jnp.where(hit, value, params[level][node, 0]))
    return state.replace(round=state.round + 1, params=tuple(params)), {"train_loss": jnp.float32(1.0)}

  return FederatedAlgorithm(init=init, round=round_fn, name="toy",
                            models=lambda s: {"root": NodeModels(s.params[0], np.zeros(1, np.int32))})


@pytest.mark.parametrize("level,node", [(1, 2), (0, 0)])
def test_an_exploded_finite_state_stops_the_round_it_happens_naming_the_node(level, node):
  saved = []
  with pytest.raises(loop.NonFiniteLossError,
                     match=(rf"run 'toy' diverged at round 3: values beyond the divergence bound "
                            rf"±1e\+15 .*server level {level}, node {node} .*the server state exploded")):
    loop.run(_exploding(3, level, node), None, num_rounds=6, key=jax.random.key(0), rounds_per_call=1,
             on_call=lambda s, r: saved.append(r))
  assert saved == [1, 2]  # the diverged round 3 never reached the checkpoint hook


def test_the_bound_is_configurable_and_none_checks_only_finiteness():
  alg = _exploding(2, value=1e6)
  with pytest.raises(loop.NonFiniteLossError, match=r"±1000 .*server level 1, node 2"):
    loop.run(alg, None, num_rounds=3, key=jax.random.key(0), max_abs=1e3)
  state = loop.run(alg, None, num_rounds=3, key=jax.random.key(0), max_abs=None)
  assert int(state.round) == 3
  with pytest.raises(ValueError, match="max_abs=-1.0 must be > 0"):
    loop.run(alg, None, num_rounds=3, key=jax.random.key(0), max_abs=-1.0)


def test_a_nan_is_still_reported_as_non_finite_not_as_the_bound():
  alg = _exploding(2, value=float("nan"))
  with pytest.raises(loop.NonFiniteLossError, match=r"non-finite values in server level 1, node 2"):
    loop.run(alg, None, num_rounds=3, key=jax.random.key(0))


def test_diverged_part_names_the_row_on_the_host():
  state = _exploding().init(None)
  assert loop.diverged_part(state) is None
  bad = state.replace(params=(state.params[0], state.params[1].at[3, 1].set(2e20)))
  assert loop.diverged_part(bad) == "server level 1, node 3 (state.params[1]): |value| 2e+20"
  assert loop.diverged_part(bad, max_abs=1e30) is None


def test_a_checkpoint_of_a_diverged_state_is_not_resumed(tmp_path):
  state = _exploding().init(None)
  ckpt = Checkpointer(str(tmp_path), every=1, keep=3)
  ckpt.maybe_save(state.replace(round=jnp.int32(1)))
  ckpt.maybe_save(state.replace(round=jnp.int32(2), params=(state.params[0] + 1e30, state.params[1])))
  warnings = []
  got = ckpt.restore(state, warn=warnings.append, check=loop.diverged_part)
  assert int(got.round) == 1
  assert len(warnings) == 1 and "its state diverged: server level 0, node 0" in warnings[0], warnings
  assert ckpt.latest_round() == 1  # the diverged one is deleted
  ckpt.maybe_save(state.replace(round=jnp.int32(3), params=(state.params[0] + 1e30, state.params[1])))
  ckpt._delete(1)
  with pytest.raises(CheckpointError, match="no checkpoint .* restores"):
    ckpt.restore(state, warn=warnings.append, check=loop.diverged_part)
  ckpt.close()


def tiny_fedadam(rounds=5):
  """FedAdam on a tiny problem whose server rate jumps to 1e30 in its 4th round."""
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.checkpoint_every, c.progress = rounds, 100, 1, 1, False
  c.keep_checkpoints, c.plots = 10, False
  c.data.group_sizes, c.data.dim, c.data.max_examples, c.data.test_examples = (3, 2), 6, 16, 4
  c.model.hidden = (4,)
  c.runs = ml_collections.ConfigDict({"fedadam": ml_collections.ConfigDict(dict(
    algorithm="fedopt", cohort_size=3, server=dict(
      name="fedadam", tau=1e-3,
      learning_rate=dict(name="linear_schedule", init_value=0.01, end_value=1e30, transition_steps=1,
                         transition_begin=2))))})
  c.run_order = ("fedadam",)
  return c


def test_a_run_whose_server_explodes_keeps_only_its_good_checkpoints(tmp_path):
  c = tiny_fedadam()
  c.divergence_bound = 1e20  # the config's bound reaches the loop
  with pytest.raises(FloatingPointError, match=r"run 'fedadam' diverged at round 4: .*divergence bound "
                                               r"±1e\+20 .* server level 0, node 0"):
    experiment.train_and_evaluate(c, str(tmp_path))
  assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints" / "fedadam")) == [1, 2, 3]
  assert not (tmp_path / "summary.json").exists()
  # re-running resumes round 3 (good) and diverges again at 4, never from a poisoned state
  with pytest.raises(FloatingPointError, match="diverged at round 4"):
    experiment.train_and_evaluate(c, str(tmp_path))


def test_config_divergence_bound_is_validated():
  c = tiny_fedadam(rounds=2)
  c.divergence_bound = -1.0
  with pytest.raises(ValueError, match=r"config.divergence_bound=-1.0 must be a finite number > 0"):
    experiment.validate_config(c)
