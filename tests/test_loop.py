"""Unit tests of fedtree.core.loop: compiled rounds cached per round function and fuse length,
the evaluation cadence, and the divergence check naming the round, the state's row (by the
names each state declares, RowName) and the client whose update was not finite."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import poisoned_problem

from fedtree.core import loop
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels, TreeState


def _toy(bad_round=None, bad_level=1, bad_node=2):
  """A model-free algorithm on a 2-level state; puts a NaN at ``bad_node`` of ``bad_level``
  in round ``bad_round``."""
  traces = []

  def init(key):
    del key
    return TreeState(round=jnp.zeros((), jnp.int32), params=(jnp.zeros((1, 3)), jnp.zeros((4, 3))),
                     opt_state=((), ()))

  def round_fn(state, data, key):
    traces.append(1)
    params = [p + jax.random.normal(key, p.shape) for p in state.params]
    if bad_round is not None:
      hit = state.round + 1 == bad_round
      params[bad_level] = params[bad_level].at[bad_node, 1].set(
        jnp.where(hit, jnp.nan, params[bad_level][bad_node, 1]))
    return state.replace(round=state.round + 1, params=tuple(params)), {"train_loss": jnp.float32(1.0)}

  alg = FederatedAlgorithm(init=init, round=round_fn,
                           models=lambda s: {"root": NodeModels(s.params[0], np.zeros(1, np.int32))},
                           name="toy")
  return alg, traces


def test_repeated_runs_with_state_compile_once():
  alg, traces = _toy()
  state = loop.run(alg, None, num_rounds=2, key=jax.random.key(0), rounds_per_call=2)
  for target in (4, 6, 8):
    state = loop.run(alg, None, num_rounds=target, key=jax.random.key(0), rounds_per_call=2, state=state)
  assert int(state.round) == 8 and len(traces) == 1
  ref = loop.run(alg, None, num_rounds=8, key=jax.random.key(0), rounds_per_call=4)
  np.testing.assert_allclose(np.asarray(state.params[1]), np.asarray(ref.params[1]), rtol=1e-6)


def test_eval_cadence_cuts_fused_calls_and_each_length_compiles_once():
  alg, traces = _toy()
  seen = []
  loop.run(alg, None, num_rounds=10, key=jax.random.key(0), rounds_per_call=4, eval_every=3,
           on_eval=lambda s, r: seen.append(r) or {"x": 1.0})
  assert seen == [3, 6, 9, 10]
  assert len(traces) == 2  # calls of 3, 3, 3, 1 rounds: two distinct lengths


@pytest.mark.parametrize("level,node,where", [(1, 2, "server level 1, node 2"),
                                              (0, 0, "server level 0, node 0")])
def test_divergence_in_a_fused_call_names_round_level_and_node(level, node, where):
  alg, _ = _toy(bad_round=3, bad_level=level, bad_node=node)
  with pytest.raises(loop.NonFiniteLossError, match=f"run 'toy' diverged at round 3: .*{where}"):
    loop.run(alg, None, num_rounds=4, key=jax.random.key(0), rounds_per_call=4)


def test_divergence_names_the_client_whose_update_is_not_finite():
  """Client 1's data are NaN: its update is averaged into the server model, yet the error
  names client 1 (train_cohort's ``first_nonfinite``), not only the server node."""
  import optax

  from fedtree.algorithms import fedavg
  from fedtree.core.local import LocalSchedule

  model, _, bad = poisoned_problem()
  alg = fedavg(model=model, data=bad, local_optimizer=optax.sgd(0.1),
               schedule=LocalSchedule(batch_size=2, epochs=1), chunk_size=2)
  with pytest.raises(loop.NonFiniteLossError, match=r"round 1: client 1 sent a non-finite update"):
    loop.run(alg, bad, num_rounds=2, key=jax.random.key(0), cache=None)
  good = bad.replace(x_train=jnp.nan_to_num(bad.x_train))
  rows = []
  loop.run(alg, good, num_rounds=1, key=jax.random.key(0), cache=None,
           on_metrics=lambda r, m: rows.append(m))
  assert "nonfinite_client" not in rows[0]  # read by the check, not logged


# ------------------------------------------------------------------------ named state rows
def test_states_name_their_rows_without_key_paths():
  """Each state declares what its rows are (RowName): B-HFL's last level is its clients, a
  cluster state's rows are clusters, a sweep's are experiments, a composition nests its stages'."""
  from fedtree.algorithms.clustering.ops import ClusterState
  from fedtree.algorithms.hierarchical.bhfl.bhfl import BHFLState
  from fedtree.core.algorithm import StagesState, state_row_names
  from fedtree.core.sweep import SweepState

  z = lambda *s: jnp.zeros(s)  # noqa: E731
  bh = BHFLState(round=jnp.int32(0), params=(z(1, 2), z(2, 2), z(5, 2)), up_state=(z(1), z(2)),
                 down_state=(z(2), z(5)), pending=((), ()), version=(z(1), z(2)))
  names = [n.row(3) for n in state_row_names(bh)]
  assert names == ["row 3", "server level 0, node 3", "server level 1, node 3", "client 3",
                   "server level 0, node 3", "server level 1, node 3", "server level 1, node 3",
                   "client 3", "server level 0, node 3", "server level 1, node 3"]
  cl = ClusterState(round=jnp.int32(0), params=z(2, 3), opt_state=(), cluster_of=z(5),
                    num_clusters=jnp.int32(2))
  assert [n.row(1) for n in state_row_names(cl)] == ["row 1", "cluster 1", "client 1", "row 1"]
  tree = TreeState(round=jnp.int32(0), params=(z(1, 3), z(4, 3)), opt_state=((), ()), client_state=z(6))
  both = StagesState(round=jnp.int32(0), stages=(tree, {"w": z(2)}))  # a stage that names nothing
  assert [n.row(2) for n in state_row_names(both)] == [
    "row 2", "row 2", "server level 0, node 2", "server level 1, node 2", "client 2", "row 2"]
  sw = SweepState(round=jnp.int32(0), inner=tree, keys=z(2, 2), hparams={"lr": z(2)})
  assert [n.part() for n in state_row_names(sw)] == [
    "row state", "row state", "server level 0", "server level 1", "client state", "experiment state",
    "experiment state"]
  assert loop.describe_leaf(".inner.params[1]['w']", state_row_names(sw)[3], 1,
                            lambda e: f"experiment {e}") == (
    "experiment 1, server level 1 (state.inner.params[1]['w'])")


def test_a_bhfl_client_row_diverging_is_named_a_client():
  """B-HFL's client level (``params[depth]``) is named by its own row names, not as a server level."""
  from fedtree.algorithms.hierarchical.bhfl.bhfl import BHFLState

  def init(key):
    del key
    return BHFLState(round=jnp.zeros((), jnp.int32), params=(jnp.zeros((1, 2)), jnp.zeros((3, 2))),
                     up_state=((),), down_state=((),), pending=((),), version=(jnp.zeros(1),))

  def round_fn(state, data, key):
    bad = state.params[1].at[2, 0].set(jnp.nan)
    return state.replace(round=state.round + 1, params=(state.params[0], bad)), {}

  alg = FederatedAlgorithm(init=init, round=round_fn, models=lambda s: {}, name="toy")
  with pytest.raises(loop.NonFiniteLossError, match=r"client 2 \(state\.params\[1\]\)"):
    loop.run(alg, None, num_rounds=1, key=jax.random.key(0), cache=None)
