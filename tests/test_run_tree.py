"""Every capability reads the tree and cohort of the algorithm it is attached to, never the
config's (issue 43 item 1).

The context is a config whose tree has groups (root -> 2 groups -> 3 clients each); the runs
under test are one-server runs (FedAvg: one server over all 6 clients, a cohort of 2, sampling
rate 1/3, where the config's tree would say 2 of 3 per group, rate 2/3). Privacy accounts and
normalises with the run's cohort, an attack's and an aggregator's and a compressor's ``level``
are levels of the run's tree, a blockwise aggregator's memory is the run's cohort, and a
systems section's server links are the run's (none below a one-server root). Each reproduced
the bug before the fix (the ε of rate 2/3, a crash, an attack on the groups of a tree FedAvg
does not have, ...)."""

import jax
import ml_collections
import numpy as np
import pytest
from helpers import small_context

from fedtree.experiment import privacy as xp
from fedtree.experiment import registry
from fedtree.experiment.robust import block_estimate
from fedtree.experiment.run_context import RunContext

dp_accounting = pytest.importorskip("dp_accounting")


def _ctx():
  ctx = small_context()
  assert ctx.topology.depth == 2 and list(ctx.topology.leaf_counts(1)) == [3, 3]   # the config's tree
  return ctx


def _run(**fields):
  return ml_collections.ConfigDict({"algorithm": "fedavg", "chunk_size": 2, "cohort_size": 2,
                                    "weighting": "uniform", **fields})


def _final_params(alg, ctx):
  """The models after one round."""
  state, _ = jax.jit(alg.round)(alg.init(jax.random.key(0)), ctx.data, jax.random.key(3))
  return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(state.params)])


def test_the_run_tree_is_the_algorithms():
  """FedAvg/FedOpt and the clustered family: one server; HierFAVG, B-HFL, pFedMT: the config's;
  an optional tree: the run's ``tree`` field; GroupPerFL: its data groups. The tree the run's
  algorithm is built on has the same depth (its state's server levels)."""
  ctx = _ctx()
  depth = {}
  for name in ("fedavg", "fedopt", "cfl", "hierfavg", "bhfl", "pfedmt", "fedprox", "grouppfl"):
    depth[name] = registry.run_topology(name, ml_collections.ConfigDict({"algorithm": name}), ctx).depth
  assert depth == {"fedavg": 1, "fedopt": 1, "cfl": 1, "hierfavg": 2, "bhfl": 2, "pfedmt": 2,
                   "fedprox": 1, "grouppfl": 2}
  run = ml_collections.ConfigDict({"algorithm": "fedprox", "tree": "config"})
  assert registry.run_topology("x", run, ctx) is ctx.topology
  for name, extra in (("fedavg", {}), ("hierfavg", {}), ("fedprox", {"tree": "config", "mu": 0.1}),
                      ("fedprox", {"mu": 0.1})):
    run = ml_collections.ConfigDict({"algorithm": name, "chunk_size": 3, **extra})
    alg = registry.build_algorithm(name, run, ctx)
    state = jax.eval_shape(alg.init, jax.random.key(0))
    assert len(state.params) == registry.run_topology(name, run, ctx).depth, (name, extra)
  rc = RunContext(ctx, "fedavg", _run())
  assert rc.topology.depth == 1 and rc.cohort.tolist() == [2] and rc.data is ctx.data


# ------------------------------------------------------------------------ privacy
def test_privacy_accounts_at_the_run_sampling_rate():
  """ε of a one-server run with a cohort of 2 of 6 is that of q = 1/3 (before: 2/3, the
  config's groups of 3), through the runner's hook and a sweep's calibration alike."""
  ctx = _ctx()
  run = _run(privacy={"clip_norm": 1.0, "noise_multiplier": 1.0}, rounds=5)
  got = xp.round_metrics("fedavg", run, ctx)(5)["epsilon"]
  want = xp.epsilon(noise_multiplier=1.0, sampling_rate=1 / 3, rounds=5, delta=1e-5, sampling="fixed",
                    population=6, cohort=2)
  wrong = xp.epsilon(noise_multiplier=1.0, sampling_rate=2 / 3, rounds=5, delta=1e-5, sampling="fixed",
                     population=3, cohort=2)
  assert got == pytest.approx(want, rel=1e-9) and got < wrong
  p = xp.plan(run.privacy.to_dict(), ctx, run=run, params={}, verbose=False)   # a plain context too
  assert (p.sampling_rate, p.population, p.cohort, p.depth) == (pytest.approx(1 / 3), 6, 2, 1)
  assert p.expected.tolist() == [2]
  hier = _run(algorithm="hierfavg", privacy={"clip_norm": 1.0, "noise_multiplier": 1.0})
  p = xp.plan(hier.privacy.to_dict(), ctx, run=hier, params={}, verbose=False)   # on the config's tree
  assert (p.sampling_rate, p.population, p.depth, p.expected.tolist()) == (pytest.approx(2 / 3), 3, 2, [2, 2])


def test_privacy_fixed_normalisation_divides_by_the_run_cohort():
  """``normalize='fixed'`` on a one-server run crashed (the config's 2 parents' expected cohorts
  against FedAvg's one); with uniform weights and fixed-size cohorts it now equals the counted
  normalisation (the expected cohort is the count, 2, and both add noise of std 2 z C)."""
  ctx = _ctx()
  out = {}
  for normalize in ("fixed", "count"):
    run = _run(privacy={"clip_norm": 0.5, "noise_multiplier": 0.8, "normalize": normalize})
    out[normalize] = _final_params(registry.build_algorithm("fedavg", run, ctx), ctx)
  assert np.all(np.isfinite(out["fixed"]))
  np.testing.assert_allclose(out["fixed"], out["count"], rtol=1e-6, atol=1e-7)


def test_grouppfl_runs_privacy_on_its_groups_and_refuses_a_fixed_normalisation():
  """GroupPerFL's tree is its data groups (root -> groups -> clients); its global stage puts every
  client under one group, so the per-parent expected cohort of ``normalize='fixed'`` fits one
  stage only: refused by name (it crashed in the global stage), where the counted one runs."""
  from helpers import ALGORITHM_CASES

  ctx = _ctx()
  run = _run(algorithm="grouppfl", **ALGORITHM_CASES["grouppfl"])
  del run["weighting"]
  run.privacy = {"clip_norm": 0.5, "noise_multiplier": 1.0, "normalize": "fixed"}
  with pytest.raises(ValueError, match=r"normalize='fixed' with algorithm='grouppfl': .* normalize='count'"):
    registry.build_algorithm("grouppfl", run, ctx)
  run.privacy.normalize = "count"   # (test_privacy runs GroupPerFL with it)
  p = xp.plan(run.privacy.to_dict(), ctx, run=run, params={}, verbose=False)
  assert (p.depth, p.expected.tolist(), p.sampling_rate) == (2, [2, 2], pytest.approx(2 / 3))
  registry.build_algorithm("grouppfl", run, ctx)


# ------------------------------------------------------------------------ attacks
def test_an_attack_level_is_a_level_of_the_run_tree():
  """``level=0`` of a one-server run is its root, whose children are the clients: the clients
  attack, as with ``-1`` (before: the config's groups attacked a root FedAvg does not have);
  ``level=1`` is refused, naming the run's levels."""
  ctx = _ctx()
  attack = {"name": "sign_flip", "fraction": 0.5, "seed": 1}
  runs = {lv: _run(attack={**attack, "level": lv}) for lv in (0, -1)}
  got = {lv: _final_params(registry.build_algorithm("fedavg", r, ctx), ctx) for lv, r in runs.items()}
  np.testing.assert_array_equal(got[0], got[-1])
  honest = _final_params(registry.build_algorithm("fedavg", _run(), ctx), ctx)
  assert not np.allclose(got[0], honest)
  with pytest.raises(ValueError, match=r"level=1: .* choose one of \[0\] or -1"):
    registry.build_algorithm("fedavg", _run(attack={**attack, "level": 1}), ctx)
  # on the config's tree (HierFAVG) level 0 is still the groups attacking the root
  registry.build_algorithm("hierfavg", _run(algorithm="hierfavg", attack={**attack, "level": 0}), ctx)


# ------------------------------------------------------------------------ robust aggregation
def test_robust_aggregation_levels_and_memory_are_the_run_tree():
  ctx = _ctx()
  with pytest.raises(ValueError, match=r"level 1, but the tree's server levels are 0..0"):
    registry.build_algorithm("fedavg", _run(aggregator={"name": "median", "levels": 1}), ctx)
  registry.build_algorithm("fedavg", _run(aggregator={"name": "median", "levels": 0}), ctx)
  run = _run(aggregator={"name": "multi_krum", "f": 0})
  param_bytes = sum(int(np.prod(np.shape(x))) * 4 for x in jax.tree.leaves(ctx.model.init(jax.random.key(0))))
  # one parent with a cohort of 2 (before: the config's 2 groups x 2 = 4 rows)
  assert block_estimate(run, ctx, "fedavg") == (param_bytes, 2, 2, True)
  hier = _run(algorithm="hierfavg", aggregator={"name": "multi_krum", "f": 0})
  assert block_estimate(hier, ctx, "hierfavg") == (param_bytes, 4, 2, True)


# ------------------------------------------------------------------------ compression
def test_a_compression_level_is_a_level_of_the_run_tree():
  ctx = _ctx()
  q = {"uplink": {"name": "qsgd", "bits": 4}}
  with pytest.raises(ValueError, match=r"level 1, but the tree's server levels are 0..0"):
    registry.build_algorithm("fedavg", _run(compression={**q, "level": 1}), ctx)
  paths = registry.factory_kwargs("fedavg", _run(compression={**q, "level": 0}), ctx)["update_paths"]
  assert set(paths) == {0} and paths[0].client is not None
  alg = registry.build_algorithm("fedavg", _run(compression={**q, "level": 0}), ctx)
  assert np.all(np.isfinite(_final_params(alg, ctx)))


# ------------------------------------------------------------------------ systems
def test_systems_server_links_are_the_run_tree():
  """A one-server run has no server below its root: per-level server links are refused (one
  number, every level, is none), where HierFAVG on the config's tree takes one level's."""
  ctx = _ctx()
  with pytest.raises(ValueError, match=r"server_up has 1 entries; .*\(0: levels \[\]\)"):
    registry.build_algorithm("fedavg", _run(systems={"server_up": [1e6]}), ctx)
  registry.build_algorithm("fedavg", _run(systems={"server_up": 1e6}), ctx)
  registry.build_algorithm("hierfavg", _run(algorithm="hierfavg", systems={"server_up": [1e6]}), ctx)


def test_every_capability_converter_gets_the_run_context(monkeypatch):
  """The update-path sections and the systems section are converted with the run's context
  (its tree), whatever the algorithm."""
  from fedtree.experiment import updates

  seen = []

  def spy(section, ctx):
    seen.append((ctx.topology.depth, ctx.cohort.tolist()))
    return {}

  def systems_spy(section, ctx):
    seen.append(ctx.topology.depth)

  monkeypatch.setitem(updates.SECTIONS, "compression", spy)
  monkeypatch.setattr(registry, "systems_from_config", systems_spy)
  ctx = _ctx()
  registry.factory_kwargs("fedavg", _run(compression={"level": 0}, systems={"speed": 1.0}), ctx)
  registry.factory_kwargs("hierfavg", _run(algorithm="hierfavg", compression={"level": 0}), ctx)
  assert seen == [(1, [2]), 1, (2, [2, 2])]
