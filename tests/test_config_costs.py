"""What a newcomer reads in the configs (issue 57 items 19-20): a published setup without its data
names the preparation command and the variant that runs without it; every ``:offline`` variant
offers a quick mode and states its measured cost (the machine and the CPU time); the systems config's
quoted columns are the ones its command prints; the personalized table has a quick variant."""

import ast
import os
import re

import pytest
from config_files import load_config

from fedtree.experiment import runner
from fedtree.experiment.standard_tasks import QUICK_ROUNDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = ("afo_cifar100", "afo_emnist", "afo_shakespeare", "afo_stackoverflow", "flgo_cifar10",
              "leaf_femnist", "pfl_cifar10", "pfl_flair")


def _doc(name: str) -> str:
  source = open(os.path.join(ROOT, "configs", f"{name}.py")).read()
  return " ".join(ast.get_docstring(ast.parse(source)).split())


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_published_setup_names_its_offline_variant_and_its_quick_mode(name):
  c = load_config(f"benchmarks/{name}")
  assert c.without_data == f"configs/benchmarks/{name}.py:offline"
  quick = load_config(f"benchmarks/{name}", "offline,quick")
  assert quick.rounds == QUICK_ROUNDS and quick.only == quick.run_order[0] and quick.checkpoint_every == 0
  assert quick.get("without_data") is None
  doc = _doc(f"benchmarks/{name}")
  assert f"configs/benchmarks/{name}.py:offline,quick" in doc, name


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_quick_mode_states_its_measured_cost(name):
  doc = _doc(f"benchmarks/{name}")
  quick = doc[doc.index(":offline,quick"):]
  assert (re.search(r"\d+ s CPU, .* on the shared 2-core CPU", quick)      # the CPU time and the machine
          or re.search(r"\d+ s wall and (\d+ min )?\d+ s of CPU time \(on 2026-12-07 on the project's quiet "
                       r"2-core machine\)", quick)), name


def test_a_missing_dataset_is_refused_naming_the_command_and_the_variant_without_it(tmp_path):
  """Item 19: the refusal named the preparation command only; it names both."""
  c = runner.prepare_config(load_config("benchmarks/afo_emnist"))
  c.data.train_path = str(tmp_path / "missing_train.h5")
  c.data.test_path = str(tmp_path / "missing_test.h5")
  with pytest.raises(ValueError, match=r"not prepared. Prepare them once where internet is available .*curl "
                                       r".*; or run the same setup without the data files: python -m "
                                       r"fedtree.main --config=configs/benchmarks/afo_emnist.py:offline$"):
    runner.make_context(c)
  assert load_config("pfedmt_mnist").without_data == "configs/pfedmt_mnist.py:digits"
  assert load_config("pfedmt_mnist", "cnn").without_data == "configs/pfedmt_mnist.py:cnn+digits"
  assert load_config("pfedmt_mnist", "digits").get("without_data") is None


def test_the_systems_docstring_quotes_the_columns_its_command_prints():
  """Item 20: the docstring quoted hours-to-target columns the command never printed; the config sets
  ``target_accuracy``, so the final table prints "rounds to" and "hours to" it, and the docstring
  quotes that table."""
  c = load_config("systems")
  doc = _doc("systems")
  assert c.target_accuracy == 0.7
  assert "rounds to 0.7 hours to 0.7" in doc
  assert "hours to 0.72" not in doc


@pytest.mark.slow   # (10 s: the systems config's run)
def test_hours_to_target_is_the_simulated_clock_at_the_first_round_at_the_target(tmp_path, capsys):
  """The summary's ``hours_to_target`` is ``sim_seconds`` / 3600 of the first evaluation at the
  target (metrics.jsonl), printed as the final table's "hours to" column."""
  import json

  from helpers import hierfavg_config

  from fedtree import experiment

  c = hierfavg_config(rounds=4)
  c.eval_every = 1
  c.target_accuracy = 0.0   # reached at the first evaluation
  c.runs.hierfavg.systems = {"speed": {"dist": "lognormal", "median": 2.0, "sigma": 1.0}}
  results = experiment.train_and_evaluate(c, str(tmp_path))
  out, _ = capsys.readouterr()
  s = results["hierfavg"]["level1"]
  rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
  first = s["rounds_to_target"]
  seconds = next(r["sim_seconds"] for r in rows if r["round"] == first and "sim_seconds" in r)
  assert s["hours_to_target"] == pytest.approx(seconds / 3600)
  assert "hours to 0" in out


def test_the_personalized_table_has_a_quick_variant_with_its_cost():
  c = load_config("personalized", "quick")
  assert len(c.run_order) == 6 and c.sweep.seeds == 1 and c.rounds == 30
  runner.validate_config(runner.prepare_config(c))
  doc = _doc("personalized")
  assert "configs/personalized.py:quick" in doc and "CPU" in doc[doc.index(":quick"):]


MEASURED_COSTS = ["quickstart", "personalization", "compression", "systems", "pfedmt_synthetic", "bhfl",
                  "clustered", "heterogeneous", "tuning", "mobility", "baselines", "personalized",
                  "pfedmt_mnist", "peft_lm", "group_personalized", "group_personalized_lm", "privacy",
                  "robust"]
"""The configs whose docstrings state a cost measured on 2026-12-07 or later (the others still read 'about
...')."""


@pytest.mark.parametrize("name", MEASURED_COSTS)
def test_a_config_states_its_cost_as_wall_and_cpu_time_and_the_date(name):
  """Issue 59 item 3: a config's docstring gives its CPU time beside its wall time, and when it was
  measured (2026-12-07 or later, the project's quiet 2-core machine)."""
  doc = _doc(name)
  stated = (re.search(r"\d+ s wall(,| and) (\d+ min )?\d+ s (of )?CPU", doc)
            or re.search(r"\d+ s on a 2-core CPU \(\d+ s of CPU", doc))
  assert stated, name
  assert max(re.findall(r"20\d\d-\d\d-\d\d", doc), default="") >= "2026-12-07", name
