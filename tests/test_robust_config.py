"""The ``attack`` and ``aggregator`` run sections (fedtree.experiment.capabilities.robust): composed into the
update paths of any algorithm with ``update_paths``, their metrics in the round's, and the
combinations that cannot work refused by name."""

import jax
import ml_collections
import numpy as np
import pytest
from helpers import count_traces
from helpers import small_context as _ctx
from helpers import with_update_paths as _with_path

from fedtree.core.updates import ClientContext
from fedtree.experiment import capabilities as sections
from fedtree.experiment import registry
from fedtree.toolbox import attacks, robust


def _paths(ctx, **secs):
  return sections.update_paths_from_config(secs, ctx)["update_paths"]


def test_sections_build_the_paths():
  ctx = _ctx()
  paths = _paths(ctx, attack={"name": "sign_flip", "ids": [1, 4], "scale": 3.0},
                 aggregator={"name": "multi_krum", "f": 1, "levels": [0, -1]})
  assert set(paths) == {0, -1}
  assert paths[-1].client.name == "sign_flip" and paths[-1].aggregator.name == "multi_krum"
  assert paths[0].client is None and paths[0].aggregator.name == "multi_krum"
  # an omniscient attack wraps the level's aggregator: the defence's, or the blockwise mean
  assert _paths(ctx, attack={"name": "alie", "fraction": 0.3},
                aggregator={"name": "median"})[-1].aggregator.name == "alie+median"
  assert _paths(ctx, attack={"name": "ipm", "fraction": 0.3, "eps": 5.0})[-1].aggregator.name == "ipm+mean"
  # the seed defaults to the config's: the same attackers as the core factory draws
  p = _paths(ctx, attack={"name": "gaussian", "fraction": 0.5, "std": 2.0})[-1]
  want = attacks.attackers(ctx.data.num_clients, fraction=0.5, seed=int(ctx.config.seed))
  ids = np.arange(ctx.data.num_clients)
  key = jax.random.key(0)
  d, _, st = jax.vmap(p.client.apply)(np.ones((len(ids), 2), np.float32), np.zeros(len(ids)),
                                      jax.random.split(key, len(ids)),
                                      ClientContext(ids, ids * 0, ids * 1.0, {}))
  np.testing.assert_array_equal(np.asarray(st["attackers"]) > 0, np.asarray(want.mask(ids, None)))


@pytest.mark.parametrize("section,match", [
  ({"attack": {"name": "boom", "fraction": 0.1}}, r"attack: attack name='boom'; choose one of \['gaussian'"),
  ({"attack": {"name": "sign_flip"}}, "attack: attackers: give one of fraction= and ids="),
  ({"attack": {"name": "sign_flip", "fraction": 0.1, "level": 2}},
   r"level=2: the server level whose children attack; choose one of \[0, 1\] or -1"),
  ({"attack": {"name": "label_flip", "fraction": 0.1, "target": 1, "level": 0}},
   "attack 'label_flip' poisons clients' data: its level is -1"),
  ({"attack": {"name": "scaling", "fraction": 0.1, "boost": 2}}, r"attack .scaling.: bad hyperparameters"),
  ({"attack": {"name": "alie", "fraction": 0.1, "eps": 2, "x": 1}}, r"alie: unknown hyperparameters \['x'\]"),
  ({"aggregator": {"name": "mode"}}, r"aggregator: aggregator 'mode' is unknown; choose one of \['bulyan'"),
  ({"aggregator": {"name": "trimmed_mean", "beta": 0.5}}, r"beta=0.5 must be in \[0, 0.5\)"),
  ({"aggregator": {"name": "median", "levels": "all"}}, "levels='all' must be a server level"),
])
def test_bad_sections_are_refused(section, match):
  with pytest.raises(ValueError, match=match):
    sections.update_paths_from_config(section, _ctx())


def test_an_algorithm_without_a_cohort_to_compare_refuses_a_robust_aggregator():
  """FedAsync applies one update a server step (clustered FL and B-HFL aggregate robustly within a
  cluster or an edge since issue 55: tests/test_clustering.py, tests/test_bhfl.py)."""
  ctx = _ctx()
  run = ml_collections.ConfigDict({"algorithm": "fedasync", "chunk_size": 3,
                                   "aggregator": {"name": "median"}})
  with pytest.raises(ValueError, match=r"fedasync: a robust \(blockwise\) aggregator at the clients' tier: "
                                       r"each server step applies one client's update alone"):
    registry.SPECS["fedasync"].factory(**registry.factory_kwargs("fedasync", run, ctx))


def test_attack_and_defence_through_hierfavg_at_two_levels():
  """Sign flippers and multi-Krum at the edges; a sign-flipping edge server (``level=0``: the
  attackers are the root's children) and the median at the root of a 3-level tree: one compile;
  the round's metrics count the attackers at both levels and Krum's kept updates."""
  ctx = _ctx()
  edges = _paths(ctx, attack={"name": "sign_flip", "ids": [0, 3]}, aggregator={"name": "multi_krum", "f": 0})
  root = _paths(ctx, attack={"name": "sign_flip", "ids": [1], "level": 0},
                aggregator={"name": "median", "levels": 0})
  assert set(root) == {0}
  paths = {0: root[0], 1: edges[-1]}
  alg = _with_path(ctx, "hierfavg", paths)
  counted, traces = count_traces(alg)
  step = jax.jit(counted.round)
  s = alg.init(jax.random.key(0))
  at_root = []
  for r in range(2):   # the root aggregates in one of every two rounds
    s, m = step(s, ctx.data, jax.random.fold_in(jax.random.key(1), r))
    assert 0 < float(m["attackers"]) < 1 and float(m["krum_selected"]) > 0
    assert 0 <= float(m["kept_attackers"]) <= float(m["krum_selected"])
    assert np.isfinite(float(m["train_loss"]))
    at_root.append(float(m["level0_attackers"]))
  assert max(at_root) == 1 / ctx.topology.num_nodes(1)
  assert len(traces) == 1


def test_fltrust_root_clients_from_the_config_are_never_attackers():
  ctx = _ctx()
  from fedtree.experiment.capabilities.robust import root_clients

  n = ctx.data.num_clients
  root = root_clients(0.25, None, ctx)
  assert len(root) == max(1, round(0.25 * n))
  bad = np.asarray(attacks.attackers(n, fraction=0.75, seed=int(ctx.config.seed)).mask(np.arange(n), None))
  assert not bad[list(root)].any()
  p = _paths(ctx, attack={"name": "label_flip", "fraction": 0.5, "target": 1},
             aggregator={"name": "fltrust", "root_fraction": 0.25})[-1]
  assert p.aggregator.name == "fltrust" and robust.watches(robust.fltrust(trusted=root))
  with pytest.raises(ValueError, match=r"root_fraction=1.0 must be in \(0, 1\)"):
    _paths(ctx, aggregator={"name": "fltrust", "root_fraction": 1.0})


def test_final_table_has_an_asr_column_only_when_reported():
  from fedtree.experiment.reporting import format_summary

  plain = {"a": {"global": {"accuracy": 0.9, "client_mean_accuracy": 0.8, "loss": 0.3}}}
  assert "ASR" not in format_summary(plain)
  both = {**plain, "b": {"global": {"accuracy": 0.7, "client_mean_accuracy": 0.6, "loss": 0.5,
                                    "attack_success_rate": 0.25}}}
  lines = format_summary(both).splitlines()
  assert lines[2].split()[-1] == "ASR" and lines[-1].split()[-1] == "0.2500"
  assert lines[-2].split() == ["a", "global", "0.9000", "0.8000", "0.3000"]   # run "a": the cell left empty


def test_attackers_at_a_server_level_are_its_children_nodes():
  """``level=0``: the attackers are edge servers (nodes of level 1), drawn among them; the
  clients' tier is untouched (run through HierFAVG in the two-level test above)."""
  ctx = _ctx()
  paths = _paths(ctx, attack={"name": "sign_flip", "fraction": 0.5, "level": 0})
  assert set(paths) == {0} and paths[0].client.name == "sign_flip"
  edges = ctx.topology.num_nodes(1)
  ids = np.arange(edges)
  d, _, st = jax.vmap(paths[0].client.apply)(np.ones((edges, 2), np.float32), np.zeros(edges),
                                             jax.random.split(jax.random.key(0), edges),
                                             ClientContext(ids, ids * 0, ids * 1.0, {}))
  want = np.asarray(attacks.attackers(edges, fraction=0.5, seed=int(ctx.config.seed)).mask(ids, None))
  assert want.sum() == 1
  np.testing.assert_array_equal(np.asarray(st["attackers"]) > 0, want)
  np.testing.assert_array_equal(np.asarray(d)[:, 0], np.where(want, -1.0, 1.0))


def test_data_attacks_poison_the_runs_data():
  from fedtree.experiment.capabilities.robust import poisoned_data

  ctx = _ctx()
  run = ml_collections.ConfigDict({"algorithm": "fedavg", "attack": {
    "name": "backdoor", "ids": [0], "target": 1, "poison_fraction": 1.0,
    "trigger": {"features": [2], "value": 7.0}}})
  data, splits = poisoned_data(run.attack, ctx)
  split = splits.get("attack_success_rate")
  x, x0, n = np.asarray(data.x_train), np.asarray(ctx.data.x_train), np.asarray(ctx.data.n_train)
  assert np.all(x[0, :n[0], 2] == 7.0) and np.all(np.asarray(data.y_train)[0, :n[0]] == 1)
  np.testing.assert_array_equal(x[1:], x0[1:])
  xt, yt, nt = map(np.asarray, split)
  assert np.all(yt == 1) and np.all(xt[..., 2] == 7.0)
  np.testing.assert_array_equal(nt, [int(np.sum(np.asarray(ctx.data.y_test)[c, :k] != 1))
                                     for c, k in enumerate(np.asarray(ctx.data.n_test))])
  # label flipping poisons the labels only, a model-poisoning attack leaves the data as it is
  flip = ml_collections.ConfigDict({"attack": {"name": "label_flip", "fraction": 0.5, "target": 2}})
  data, splits = poisoned_data(flip.attack, ctx)
  split = splits.get("attack_success_rate")
  assert split is None and int(np.sum(np.asarray(data.y_train) != np.asarray(ctx.data.y_train))) > 0
  same = ml_collections.ConfigDict({"attack": {"name": "sign_flip", "fraction": 0.5}})
  assert poisoned_data(same.attack, ctx)[0] is ctx.data
  # the section itself validates (a run field of every algorithm with update_paths)
  paths = sections.update_paths_from_config({"attack": flip.attack}, ctx)["update_paths"]
  assert all(p.is_default for p in paths.values())   # without a choosing aggregator: nothing to watch
  with pytest.raises(ValueError, match="cannot redraw them each round"):
    sections.update_paths_from_config({"attack": {"name": "label_flip", "fraction": 0.5, "target": 1,
                                                  "redraw": True}}, ctx)
  with pytest.raises(ValueError, match="its fraction cannot be a sweep axis"):   # poisoned once, before
    jax.jit(lambda f: sections.update_paths_from_config(
      {"attack": {"name": "label_flip", "fraction": f, "target": 1}}, ctx) and f)(0.5)
  with pytest.raises(ValueError, match="it needs 'target'"):
    sections.update_paths_from_config({"attack": {"name": "backdoor", "fraction": 0.5}}, ctx)


@pytest.mark.slow
def test_robust_config_end_to_end(tmp_path):
  """configs/robust.py shrunk (2 rounds, 3 runs of the table, one of the tree): a backdoor run
  reports its attack success rate beside accuracy."""
  from config_files import load_config

  from fedtree import experiment

  cases = ((None, ("backdoor_median_30", "alie_mkrum_10", "labelflip_fltrust_30")),
           ("tree", ("median_at_edges",)))
  for variant, keep in cases:
    c = load_config("robust", variant)
    for k in list(c.runs.keys()):
      if k not in keep:
        del c.runs[k]
    c.rounds, c.eval_every, c.rounds_per_call, c.progress = 2, 2, 2, False
    res = experiment.train_and_evaluate(c, str(tmp_path / str(variant)))
    assert set(res) == set(keep)
    for k in keep:
      assert 0 <= res[k]["global"]["accuracy"] <= 1
    if variant is None:
      assert 0 <= res["backdoor_median_30"]["global"]["attack_success_rate"] <= 1
      assert "attack_success_rate" not in res["alie_mkrum_10"]["global"]


def test_memory_estimate_counts_the_cohort_blocks():
  from fedtree.experiment import memory
  from fedtree.experiment.run import resolve

  ctx = _ctx()
  assert resolve("r", ml_collections.ConfigDict({"algorithm": "fedavg"}), ctx, build=False).block is None
  est = resolve("r", ml_collections.ConfigDict({"algorithm": "hierfavg", "cohort_size": 2,
                                                "aggregator": {"name": "multi_krum", "f": 0}}), ctx,
                build=False).block
  param_bytes = sum(int(np.prod(np.shape(x))) * 4 for x in jax.tree.leaves(ctx.model.init(jax.random.key(0))))
  assert est == (param_bytes, 4, 2, True)          # 2 parents x a cohort of 2; distances
  assert memory.block_bytes(100, 4, 2, pairwise=True) == 2 * 4 * 100 + 8 * 4 * 2
  assert memory.block_bytes(100, 4, 2, pairwise=False) == 800
  line = memory.check_memory("r", state_bytes=1000, step_bytes=10, chunk=2, limit=10_000, source="t",
                             block=(100, 4, 2, True))
  assert "cohort blocks" in line
  with pytest.raises(ValueError, match=r"blockwise aggregator holds every parent's cohort \(1000 slots of "
                                       r"100 bytes, with pairwise.*sample at most 23 clients per round"):
    memory.check_memory("r", state_bytes=1000, step_bytes=10, chunk=2, limit=10_000, source="t",
                        block=(100, 1000, 1000, True))


def test_robust_config_is_the_full_attack_defence_table():
  """Every attack at 10 % and 30 % against every defence (no attack once per defence), the
  defences' f and β following the fraction, and the tree's four placements of the median."""
  from config_files import load_config

  c = load_config("robust", None)
  attacks_, defences_ = ("signflip", "alie", "labelflip", "backdoor"), ("mean", "median", "trimmed", "mkrum",
                                                                        "rfa", "cclip", "fltrust")
  want = {f"none_{d}" for d in defences_} | {f"{a}_{d}_{p}" for a in attacks_ for d in defences_
                                             for p in (10, 30)}
  assert set(c.runs.keys()) == want
  assert c.runs.signflip_mkrum_10.aggregator.f == 2 and c.runs.signflip_mkrum_30.aggregator.f == 6
  assert c.runs.alie_trimmed_30.aggregator.beta == 0.3 and c.runs.alie_trimmed_30.attack.fraction == 0.3
  assert "aggregator" not in c.runs.backdoor_mean_10 and "attack" not in c.runs.none_median
  tree = load_config("robust", "tree")
  assert [tree.runs[k].get("aggregator", {}).get("levels") for k in sorted(tree.runs.keys())] == [
    [0, -1], -1, None, 0]
  with pytest.raises(ValueError, match="choose no variant"):
    load_config("robust", "table10")


@pytest.mark.slow
def test_a_sweep_reports_the_backdoor_success_rate_of_every_experiment(tmp_path):
  """A backdoor run swept over the learning rate: each setting's ``attack_success_rate`` is the
  one the same run prints alone (~16 s: two compiles)."""
  from test_sweep import tiny

  from fedtree import experiment

  def config(sweep):
    c = tiny(rounds=2)
    for k in list(c.runs.keys()):
      if k != "fedavg":
        del c.runs[k]
    c.runs.fedavg.attack = ml_collections.ConfigDict({
      "name": "backdoor", "ids": (0, 1), "target": 1, "poison_fraction": 1.0,
      "trigger": {"features": [0, 1], "value": 5.0}})
    if sweep:
      c.sweep.params = "local.learning_rate=0.02,0.1"
    else:
      del c["sweep"]
      c.local.learning_rate = 0.1
    return c

  rows = experiment.train_and_evaluate(config(True), str(tmp_path / "s"))["fedavg"]["sweep"]["settings"]
  alone = experiment.train_and_evaluate(config(False), str(tmp_path / "a"))["fedavg"]["global"]
  asr = [r["mean"]["global/attack_success_rate"] for r in rows]
  assert asr[0] != asr[1]
  np.testing.assert_allclose(asr[1], alone["attack_success_rate"], rtol=1e-6)
  np.testing.assert_allclose(rows[1]["mean"]["global/accuracy"], alone["accuracy"], rtol=1e-6)
