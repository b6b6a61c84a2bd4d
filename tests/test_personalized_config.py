"""configs/personalized.py (the personalized-FL table): every run builds on its own split and model;
a run's own ``data``/``model`` (runner.run_context); the table of the swept runs; end to end, shrunk."""

import dataclasses
import importlib.util
import os

import jax
import ml_collections
import numpy as np
import pytest
from config_files import ROOT, load_config
from helpers import small_context

from fedtree import experiment
from fedtree.experiment import registry, runner, sweep


def test_every_method_runs_on_every_split():
  """A method is one entry of METHODS: it runs on every split, and every run builds."""
  path = os.path.join(ROOT, "configs", "personalized.py")
  spec = importlib.util.spec_from_file_location("personalized", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = runner.prepare_config(mod.get_config())
  assert list(c.run_order) == [f"{m}_{s}" for s in mod.SPLITS for m in mod.METHODS]
  assert c.sweep.seeds == 3
  runner.validate_config(c)
  ctx = runner.make_context(c)
  for label in ("fedbn_path", "fedavg_dir"):
    alg = registry.build_algorithm(label, c.runs[label], ctx)
    assert alg.name == c.runs[label].algorithm


def test_a_run_has_its_own_data_and_model():
  ctx = small_context()
  run = ml_collections.ConfigDict({"algorithm": "fedbn", "model": {"norm": "batch"}})
  own = runner.run_context(ctx, run)
  assert own.model.state == ("batch_stats",) and ctx.model.state == ()
  assert own.data.x_train is ctx.data.x_train   # the model alone: the data are not loaded again
  assert runner.run_context(own, run) is own   # a run's context is final
  moved = runner.run_context(ctx, ml_collections.ConfigDict({"algorithm": "fedavg", "data": {"seed": 6}}))
  assert moved.data.num_clients == ctx.data.num_clients
  assert not np.array_equal(np.asarray(moved.data.x_train), np.asarray(ctx.data.x_train))
  with pytest.raises(ValueError, match=r"config\.runs\.x: its model .*hiden"):
    registry.build_algorithm("x", ml_collections.ConfigDict({"algorithm": "fedavg", "model": {"hiden": 3}}),
                             ctx)
  pretrained = dataclasses.replace(ctx, init_params=ctx.model.init(jax.random.key(1)))
  with pytest.raises(ValueError, match="its own model .* cannot start from the parameters every other run"):
    runner.run_context(pretrained, run)
  other_data = ml_collections.ConfigDict({"algorithm": "fedavg", "data": {"seed": 6}})
  same = runner.run_context(pretrained, other_data)
  assert same.init_params is pretrained.init_params   # other data, the same model: the same start
  bad = ml_collections.ConfigDict({"runs": {"x": {"algorithm": "fedavg", "data": {"alpha": 0.1}}},
                                   "sweep": {"params": "runs.x.data.alpha=0.1,0.2"}})
  with pytest.raises(ValueError, match="cannot be an experiment axis"):
    sweep.validate(bad)


def test_the_table_of_swept_runs():
  row = {"name": "default", "seeds": 3, "setting": {},
         "mean": {"personal/accuracy": 0.91, "personal/accuracy_worst10_mean": 0.7, "uplink_MB": 1.5,
                  "downlink_MB": 1.5},
         "std": {"personal/accuracy": 0.01, "personal/accuracy_worst10_mean": 0.02, "uplink_MB": 0.0,
                 "downlink_MB": 0.0}}
  text = sweep.runs_table({"fedper_path": {"sweep": {"settings": [row]}}, "pretrained": {"x": {}}})
  lines = text.splitlines()
  assert lines[0].startswith("every swept run (mean ± std over 3 seeds")
  assert lines[2].split() == ["fedper_path", "default", "personal", "accuracy", "0.9100", "±", "0.0100",
                              "0.7000", "±", "0.0200", "1.500", "1.500"]


@pytest.mark.slow   # three runs of two seeds, compiled: ~3 min on the loaded 2-core machine
def test_personalized_config_end_to_end(tmp_path):
  c = load_config("personalized")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 2, 2, 2, False
  c.sweep.seeds = 2
  c.model.hidden = (8,)
  c.only = "fedavg_path,fedbn_dir,fedrod_path"
  results = experiment.train_and_evaluate(c, str(tmp_path))
  rows = {label: {k for r in out["sweep"]["settings"] for k in r["mean"]} for label, out in results.items()}
  assert {"global/accuracy", "global_ft/accuracy", "global_ft/accuracy_worst10_mean", "uplink_MB"} <= rows[
    "fedavg_path"]
  assert {"personal/accuracy", "personal/accuracy_worst10_mean"} <= rows["fedbn_dir"]
  assert {"global/accuracy", "personal/accuracy"} <= rows["fedrod_path"]
