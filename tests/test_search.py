"""Adaptive search over a sweep (fedtree.experiment.search): random draws, successive halving whose
survivors go on bitwise as they would have, what a study keeps, and clear errors before compiling."""

import csv
import json
import math
import os

import jax
import numpy as np
import pytest
from config_files import load_config
from test_sweep import tiny

from fedtree import experiment
from fedtree.core import loop
from fedtree.core import sweep as stacked
from fedtree.experiment import runner, search, sweep
from fedtree.experiment.config_file import load_config as load_file
from fedtree.experiment.registry import build_algorithm

LRS = [0.01, 0.03, 0.1, 0.3]


def _four(seeds):
  """Four learning rates of the tiny FedAvg stacked with ``seeds``: ``(context, builder, algorithm)``."""
  c = tiny(rounds=4)
  c.sweep.params = "local.learning_rate=" + ",".join(map(str, LRS))
  ctx = runner.make_context(c)
  build = sweep.config_builder(c, "fedavg", ctx, build_algorithm)
  return ctx, build, stacked.sweep(build, {"local.learning_rate": LRS}, seeds)


def _leaves_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_compacted_survivors_go_on_bitwise():
  """Experiments 1 and 3 taken out of four after 2 rounds and run 2 more alone equal, bit for bit,
  the same experiments run 4 rounds among the four."""
  ctx, build, four = _four([0, 1, 0, 1])
  full = loop.run(four, ctx.data, num_rounds=4, key=jax.random.key(0), cache=None)
  half = loop.run(four, ctx.data, num_rounds=2, key=jax.random.key(0), cache=None)
  keep = [1, 3]
  two = stacked.sweep(build, {"local.learning_rate": [LRS[k] for k in keep]}, [1, 1])
  went_on = loop.run(two, ctx.data, num_rounds=4, key=jax.random.key(0), state=stacked.compact(half, keep),
                     cache=None)
  assert int(went_on.round) == 4
  _leaves_equal(stacked.compact(full, keep), went_on)
  with pytest.raises(ValueError, match=r"keeps \[\] of 4 experiments"):
    stacked.compact(full, [])


def test_survivors_keep_the_best_fraction():
  assert search.survivors([0.1, 0.5, 0.3, 0.2], 2) == [1, 2]
  assert search.survivors([0.1, 0.5, 0.3, 0.2], 3) == [1]
  assert search.survivors([0.1, 0.5, 0.3, 0.2], 2, lower_is_better=True) == [0, 3]
  assert search.survivors([float("nan"), 0.2, 0.1], 2) == [1]    # a diverged setting is last
  assert search.survivors([0.7], 3) == [0]                          # never none
  assert search.survivors([0.4, 0.4, 0.1, 0.4], 2) == [0, 1]        # ties in order


def test_random_draws_are_seeded_and_follow_their_distributions():
  params = {"a": search.Distribution("loguniform", (1e-3, 1.0)),
            "b": search.Distribution("uniform", (0.0, 2.0)), "c": [0.1, 0.2, 0.5]}
  n = 4000
  one, again = search.draw(params, n, 7), search.draw(params, n, 7)
  assert one == again and one != search.draw(params, n, 8)
  a = np.log(np.array([s["a"] for s in one]))
  b = np.array([s["b"] for s in one])
  assert a.min() >= math.log(1e-3) and a.max() <= 0 and b.min() >= 0 and b.max() <= 2
  # the mean of U(lo, hi) over n draws is within 4 standard errors, (hi - lo) / sqrt(12 n) each
  assert abs(a.mean() - math.log(1e-3) / 2) < 4 * -math.log(1e-3) / math.sqrt(12 * n)
  assert abs(b.mean() - 1.0) < 4 * 2 / math.sqrt(12 * n)
  counts = np.unique([s["c"] for s in one], return_counts=True)[1]
  assert len(counts) == 3 and np.all(np.abs(counts / n - 1 / 3) < 4 * math.sqrt(2 / 9 / n))


def test_random_search_settings_come_from_the_config():
  c = tiny(runs=("fedadam",))
  c.sweep.params = ("local.learning_rate=loguniform(0.001,1);"
                    "runs.fedadam.server.learning_rate=choice(0.01,0.1)")
  c.sweep.samples, c.sweep.sample_seed = 5, 3
  runner.validate_config(c)
  got = sweep.settings_of(c, "fedadam")
  drawn = search.draw(sweep.params_of(c.sweep), 5, 3)
  assert got == drawn and len(got) == 5
  assert all(0.001 <= s["local.learning_rate"] <= 1 for s in got)


@pytest.mark.parametrize("fields,match", [
  (dict(rungs="2,6"), r"rung 6 is not before the last round \(6\) of run 'fedavg'"),
  (dict(rungs="3,2"), "the rungs must increase"),
  (dict(rungs="2", halving_rate=1.5), "halving_rate=1.5: a rate below 2"),
  (dict(rungs="2", chunk="1"), "config.sweep.chunk=1 splits them"),
  (dict(params="local.learning_rate=loguniform(0,1)", samples=4), "loguniform needs positive bounds"),
  (dict(params="local.learning_rate=uniform(1,0.5)", samples=4), "must be below the high bound"),
  (dict(params="local.learning_rate=loguniform(0.01,1)"), "set config.sweep.samples"),
  (dict(params="local.learning_rate=normal(0,1)", samples=4), "'normal' is not a distribution"),
  (dict(samples=-1), "samples=-1 must be an int >= 0"),
])
def test_bad_search_input_is_one_clear_line_before_anything_runs(tmp_path, fields, match):
  c = tiny(rounds=6)
  c.sweep.params = "local.learning_rate=0.01,0.1"
  for k, v in fields.items():
    c.sweep[k] = v
  workdir = tmp_path / "wd"
  with pytest.raises(ValueError, match=match):
    experiment.train_and_evaluate(c, str(workdir))
  assert not workdir.exists()   # nothing written


def test_successive_halving_stops_the_worse_settings_and_keeps_the_study(tmp_path):
  c = tiny(rounds=6)
  c.eval_every = 2
  c.sweep.params = "local.learning_rate=" + ",".join(map(str, LRS))
  c.sweep.seeds, c.sweep.rungs, c.sweep.halving_rate = 2, "2,4", 2.0
  out = experiment.train_and_evaluate(c, str(tmp_path))
  rows = {r["name"]: r for r in out["fedavg"]["sweep"]["settings"]}
  assert sorted(r["rounds"] for r in rows.values()) == [2, 2, 4, 6]
  # at every rung the settings kept are the best by their mean accuracy there over the seeds
  logged = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  def acc(lr, r):
    return np.mean([x["global/accuracy"] for x in logged if x["round"] == r
                    and x["setting"]["local.learning_rate"] == lr])
  at2 = {lr: acc(lr, 2) for lr in LRS}
  went_on = [lr for lr in LRS if rows[f"learning_rate={lr:g}"]["rounds"] > 2]
  assert sorted(went_on) == sorted(sorted(LRS, key=lambda lr: -at2[lr])[:2])
  # a setting's cost is the client updates of the rounds it trained: 3 clients a round
  for r in rows.values():
    assert r["mean"]["client_updates"] == 3 * r["rounds"]
  best = out["fedavg"]["sweep"]["best"]
  assert rows[best["name"]]["rounds"] == 6
  # the study's table: a row per setting, seed and round trained, with the cost so far
  with open(tmp_path / "tuning_fedavg.csv") as f:
    table = list(csv.DictReader(f))
  assert len(table) == 2 * sum(r["rounds"] for r in rows.values())
  assert list(table[0])[:3] == ["local.learning_rate", "seed", "round"]
  assert all(int(t["client_updates"]) == 3 * int(t["round"]) for t in table)
  # the best setting's config runs as it is: the setting applied, nothing swept
  cfg = load_file(str(tmp_path / "best_fedavg.py"))
  assert cfg.local.learning_rate == best["setting"]["local.learning_rate"]
  assert cfg.sweep.params == "" and cfg.sweep.rungs == "" and cfg.sweep.seeds == 2
  assert cfg.run_order == ("fedavg",) and list(cfg.runs) == ["fedavg"]
  _searches_nothing(cfg)


def _searches_nothing(cfg):
  """A best setting's config runs its setting alone: nothing swept, drawn, halved or exploited."""
  runner.validate_config(cfg)
  assert sweep.sweep_config(cfg) is None or not sweep.params_of(cfg.sweep)
  assert search.halving_of(cfg.sweep) is None and search.pbt_of(cfg.sweep) is None
  assert search.hyperband_of(cfg.sweep) is None and not cfg.sweep.samples


def test_quickstart_keeps_the_new_sweep_fields():
  c = load_config("quickstart")
  assert c.sweep.samples == 0 and c.sweep.rungs == "" and c.sweep.halving_rate == 3.0
  assert os.path.basename(search.__file__) == "search.py"


@pytest.mark.parametrize("schedule", ["halving", pytest.param("pbt", marks=pytest.mark.slow)])
def test_a_stopped_study_resumes_to_the_same_table(tmp_path, schedule):
  """A halving or PBT study stopped after its first boundary (round 3 of 6, checkpoints every round)
  resumes from that boundary and its stretch's checkpoint to the table of the study run through."""
  def study():
    c = tiny(rounds=6)
    c.eval_every, c.rounds_per_call, c.checkpoint_every = 2, 1, 1
    c.sweep.params = "local.learning_rate=" + ",".join(map(str, LRS))
    if schedule == "halving":
      c.sweep.rungs, c.sweep.halving_rate = "2,4", 2.0
    else:
      c.sweep.pbt_interval = 2
    return c

  through = experiment.train_and_evaluate(study(), str(tmp_path / "a"))["fedavg"]["sweep"]
  calls = iter(range(100))
  with pytest.raises(runner.RunStopped):   # the third compiled call ends round 3
    experiment.train_and_evaluate(study(), str(tmp_path / "b"), should_stop=lambda: next(calls) >= 2)
  resumed = experiment.train_and_evaluate(study(), str(tmp_path / "b"))["fedavg"]["sweep"]
  assert resumed["settings"] == through["settings"]
  assert resumed.get("lineage") == through.get("lineage")
  rows = [json.loads(x) for x in open(tmp_path / "b" / "metrics.jsonl")]
  assert max(r["round"] for r in rows) == 6
  assert len({(r["experiment"], r["round"]) for r in rows}) == len(rows)   # no round logged twice


@pytest.mark.parametrize("variant", [None, "halving", "random", "pbt", "fedex", "hyperband"])
def test_the_tuning_config_sweeps_81_settings_per_run(variant):
  c = load_config("tuning", variant) if variant else load_config("tuning")
  runner.validate_config(c)
  for label in c.run_order:
    assert len(sweep.settings_of(c, label)) == {"fedex": 9, "hyperband": 17}.get(variant, 81)
  assert (search.halving_of(c.sweep, c.rounds) is not None) == (variant == "halving")


# ------------------------------------------------------------------------ population-based training
def test_an_exploited_experiment_goes_on_from_its_sources_state_with_its_own_key_bitwise():
  """After 2 rounds experiment 3 takes experiment 1's whole state and a new learning rate; at round
  4 it equals, bit for bit, a run of that learning rate with experiment 3's key started from
  experiment 1's round-2 state; the experiments that copied nobody are unchanged by the step."""
  ctx, build, four = _four([0, 1, 2, 3])
  full = loop.run(four, ctx.data, num_rounds=4, key=jax.random.key(0), cache=None)
  at2 = loop.run(four, ctx.data, num_rounds=2, key=jax.random.key(0), cache=None)
  new = [*LRS[:3], 0.07]
  pbt = stacked.exploit(at2, [0, 1, 2, 1], {"local.learning_rate": new})
  assert np.array_equal(jax.random.key_data(pbt.keys), jax.random.key_data(at2.keys))   # own keys
  went_on = loop.run(stacked.sweep(build, {"local.learning_rate": new}, [0, 1, 2, 3]), ctx.data, num_rounds=4,
                     key=jax.random.key(0), state=pbt, cache=None)
  lr = at2.hparams["local.learning_rate"]
  one = stacked.SweepState(round=at2.round, inner=jax.tree.map(lambda x: x[1:2], at2.inner),
                           keys=at2.keys[3:4], hparams={"local.learning_rate": lr[:1] * 0 + np.float32(0.07)})
  alone = loop.run(stacked.sweep(build, {"local.learning_rate": [0.07]}, [3]), ctx.data, num_rounds=4,
                   key=jax.random.key(0), state=one, cache=None)
  _leaves_equal(stacked.compact(went_on, [3]).inner, alone.inner)
  _leaves_equal(stacked.compact(went_on, [0, 1, 2]).inner, stacked.compact(full, [0, 1, 2]).inner)
  with pytest.raises(ValueError, match="a source in"):
    stacked.exploit(at2, [0, 1, 2], {"local.learning_rate": new})


def test_the_bottom_copies_the_top_and_explores_within_bounds():
  rng = np.random.default_rng(0)
  scores = [0.5, 0.9, float("nan"), 0.1, 0.7, 0.3, 0.8, 0.2]
  sources = search.exploit_sources(scores, 0.25, rng)
  assert [x for x in range(8) if sources[x] != x] == [2, 3]           # the two worst, NaN among them
  assert all(sources[x] in (1, 6) for x in (2, 3))                    # copy one of the two best
  assert search.exploit_sources(scores, 0.25, np.random.default_rng(0)) == sources   # seeded
  assert search.exploit_sources([0.1, 0.2, 0.3, 0.4], 0.25, rng, lower_is_better=True)[3] == 0
  pbt = search.PBT(interval=2, fraction=0.25, perturb=0.2, resample=0.0)
  params = {"a": [0.01, 0.1, 1.0], "b": search.Distribution("loguniform", (1e-3, 0.5))}
  seen = {round(search.explore({"a": 0.1, "b": 0.01}, params, pbt, rng)["a"], 10) for _ in range(200)}
  assert seen == {0.08, 0.12}                                           # x 0.8 or x 1.2
  assert search.explore({"a": 1.0, "b": 0.5}, params, pbt._replace(perturb=0.5), rng)["b"] <= 0.5   # bounds
  draws = [search.explore({"a": 0.1, "b": 0.01}, params, pbt._replace(resample=1.0), rng) for _ in range(200)]
  assert {d["a"] for d in draws} == {0.01, 0.1, 1.0} and all(1e-3 <= d["b"] <= 0.5 for d in draws)


def test_pbt_copies_states_and_records_the_lineage(tmp_path):
  c = tiny(rounds=6)
  c.eval_every = 2
  c.sweep.params = "local.learning_rate=" + ",".join(map(str, LRS))
  c.sweep.pbt_interval = 2
  out = experiment.train_and_evaluate(c, str(tmp_path))["fedavg"]["sweep"]
  lineage = out["lineage"]
  steps = [(x, s) for x, steps in enumerate(lineage) for s in steps[1:]]
  assert steps and {s["round"] for _, s in steps} <= {2, 4}
  assert all(s["from"] != x for x, s in steps)
  assert json.load(open(tmp_path / "pbt_fedavg.json"))["lineage"] == lineage
  rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  for x, s in steps:   # the rows of an experiment after its step carry its new values
    after = [r for r in rows if r["experiment"] == x and r["round"] > s["round"]]
    assert after and all(r["setting"] == lineage[x][-1]["setting"] or r["round"] <= lineage[x][-1]["round"]
                         for r in after)
  assert len(out["settings"]) == 4 and all(r["mean"]["client_updates"] == 18 for r in out["settings"])
  assert [r["setting"] for r in out["settings"]] == [steps_[-1]["setting"] for steps_ in lineage]
  with open(tmp_path / "tuning_fedavg.csv") as f:   # every experiment's every round, one seed for all
    assert len(list(csv.DictReader(f))) == 4 * 6
  _searches_nothing(load_file(str(tmp_path / "best_fedavg.py")))


@pytest.mark.parametrize("fields,match", [
  (dict(pbt_interval=3), "pbt_interval=3 is not a multiple of config.eval_every=2"),
  (dict(pbt_interval=6), r"pbt_interval=6 is not before the last round \(6\)"),
  (dict(pbt_interval=2, pbt_fraction=0.7), "pbt_fraction=0.7"),
  (dict(pbt_interval=2, pbt_perturb=1.5), "pbt_perturb=1.5"),
  (dict(pbt_interval=2, pbt_resample=2.0), "pbt_resample=2 is a probability"),
  (dict(pbt_interval=2, rungs="2"), "not both"),
  (dict(pbt_interval=2, params=""), "sweeps none of this run's"),
])
def test_bad_pbt_input_is_refused_before_anything_runs(tmp_path, fields, match):
  c = tiny(rounds=6)
  c.eval_every = 2
  c.sweep.params = "local.learning_rate=0.01,0.1"
  for k, v in fields.items():
    c.sweep[k] = v
  if not c.sweep.params:
    c.sweep.seeds = 2
  with pytest.raises(ValueError, match=match):
    experiment.train_and_evaluate(c, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


# ------------------------------------------------------------------------ Hyperband
def test_hyperbands_brackets_are_li_et_als():
  """Li et al. 2018, Table 1 (R = 81, η = 3): the brackets' settings and first rungs."""
  brackets = search.hyperband(81, 3, 1)
  assert [(b.s, b.settings) for b in brackets] == [(4, 81), (3, 34), (2, 15), (1, 8), (0, 5)]
  assert [b.rungs for b in brackets] == [(1, 3, 9, 27), (3, 9, 27), (9, 27), (27,), ()]


def test_hyperband_runs_its_brackets_and_names_the_best(tmp_path):
  c = tiny(rounds=6)
  c.eval_every = 1
  c.sweep.params = "local.learning_rate=loguniform(0.01,0.5)"
  c.sweep.hyperband_min_rounds, c.sweep.halving_rate = 1, 2.0
  out = experiment.train_and_evaluate(c, str(tmp_path))["fedavg"]["sweep"]
  brackets = search.hyperband(6, 2.0, 1)
  assert [b["settings"] for b in out["brackets"]] == [b.settings for b in brackets] == [4, 3, 3]
  for b in brackets:   # every bracket halves its own draws: at each rung the kept share, to round 6
    reached = sorted(r["rounds"] for r in out["settings"] if r["bracket"] == b.s)
    n, expected = b.settings, []
    for rung in b.rungs:
      keep = max(1, n // 2)
      expected += [rung] * (n - keep)
      n = keep
    assert reached == sorted(expected + [6] * n), (b, reached)
  assert out["client_updates"] == sum(r["mean"]["client_updates"] for r in out["settings"])
  assert out["best"]["name"] in {r["name"] for r in out["settings"] if r["rounds"] == 6}
  cfg = load_file(str(tmp_path / "best_fedavg.py"))
  assert cfg.local.learning_rate == out["best"]["setting"]["local.learning_rate"]
  assert cfg.run_order == ("fedavg",)
  _searches_nothing(cfg)


@pytest.mark.parametrize("fields,match", [
  (dict(hyperband_min_rounds=6), r"hyperband_min_rounds=6 is not before the last round \(6\)"),
  (dict(hyperband_min_rounds=1, rungs="2"), "leave config.sweep.rungs unset"),
  (dict(hyperband_min_rounds=1, samples=4), "leave config.sweep.samples unset"),
  (dict(hyperband_min_rounds=1, halving_rate=1.5), "Hyperband's rate must be >= 2"),
])
def test_bad_hyperband_input_is_refused_before_anything_runs(tmp_path, fields, match):
  c = tiny(rounds=6)
  c.sweep.params = "local.learning_rate=loguniform(0.01,0.5)"
  for k, v in fields.items():
    c.sweep[k] = v
  with pytest.raises(ValueError, match=match):
    experiment.train_and_evaluate(c, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()
