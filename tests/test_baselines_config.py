"""configs/baselines.py (the related-work table) and what its table needs from the runner: the
rounds to a target accuracy (also across a resume), the clients' fairness and the bytes per seed, and
one table across the swept runs."""

import json

import ml_collections
import pytest
from config_files import load_config
from helpers import hierfavg_config

from fedtree.experiment import registry, runner, sweep
from fedtree.experiment.reporting import Reporter
from fedtree.experiment.runner import train_and_evaluate

ISSUE_36 = {"fedavg", "fedprox", "fedavgm", "fedadam", "scaffold", "moon", "qffl", "afl", "fedasync",
            "feddyn", "fednova", "mime", "mimelite"}


def test_baselines_config_is_well_formed():
  c = runner.prepare_config(load_config("baselines"))
  runner.validate_config(c)
  assert ISSUE_36 <= set(c.runs)
  assert c.data.name == "sklearn_digits" and c.data.partition == "dirichlet"
  assert c.sweep.seeds >= 2 and c.target_accuracy is not None
  ctx = runner.make_context(c)
  for label, run in c.runs.items():
    registry.build_algorithm(label, run, ctx)   # every run builds (nothing refused)


@pytest.mark.slow
def test_baselines_config_end_to_end(tmp_path, capsys):
  """Shrunk: 4 rounds of three of its runs (FedAsync with its systems section and its rounds
  scaled), 2 seeds each; the table across the runs has a row per run with every column."""
  c = load_config("baselines")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = 4, 2, 2, False, False
  c.runs = ml_collections.ConfigDict({k: c.runs[k] for k in ("fedavg", "qffl", "fedasync")})
  c.runs.fedasync.rounds = 8
  c.run_order = ("fedavg", "qffl", "fedasync")
  c.sweep.seeds = 2
  c.target_accuracy = 0.3
  results = train_and_evaluate(c, str(tmp_path))
  out = capsys.readouterr().out
  table = out[out.index("runs (mean ± std over seeds)"):]
  for label in ("fedavg", "qffl", "fedasync"):
    row = results[label]["sweep"]["settings"][0]
    assert row["seeds"] == 2
    for column in c.sweep.columns:
      assert column in row["mean"], (label, column)
    line = next(x for x in table.splitlines() if x.startswith(label))
    assert line.count("±") >= len(c.sweep.columns) - 1, line
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["qffl"]["sweep"]["settings"][0]["mean"]["uplink_MB"] > summary["fedavg"]["sweep"][
    "settings"][0]["mean"]["uplink_MB"]   # q-FFL's clients send h_k beside their model


@pytest.mark.slow   # (the table's parts have fast tests below)
def test_rounds_to_target_is_the_first_evaluation_at_it_and_survives_a_resume(tmp_path, capsys):
  c = hierfavg_config(rounds=2)
  c.target_accuracy = 1.01   # never
  assert train_and_evaluate(c, str(tmp_path))["hierfavg"]["global"]["rounds_to_target"] is None
  assert "rounds to 1.01" in capsys.readouterr().out
  c.rounds, c.target_accuracy = 4, 0.0   # resumes from round 2's checkpoint: round 2's row reached it
  assert train_and_evaluate(c, str(tmp_path))["hierfavg"]["global"]["rounds_to_target"] == 2


def test_first_round_at_a_target_is_read_from_the_rows(tmp_path):
  rep = Reporter(str(tmp_path), show_progress=False)
  for r, acc in ((2, 0.5), (4, 0.81), (6, 0.79), (8, 0.9)):
    rep.log("a", r, {"global/accuracy": acc, "experiment": 0})
    rep.log("a", r, {"global/accuracy": acc - 0.1, "experiment": 1})
  rep.close()
  assert rep.first_round("a", "global/accuracy", 0.8, upto=8, match={"experiment": 0}) == 4
  assert rep.first_round("a", "global/accuracy", 0.8, upto=8, match={"experiment": 1}) == 8
  assert rep.first_round("a", "global/accuracy", 0.8, upto=6, match={"experiment": 1}) is None
  assert rep.first_round("b", "global/accuracy", 0.1, upto=8) is None


def test_the_table_across_runs_counts_the_seeds_that_reached_the_target():
  finals = [[{"global/accuracy": 0.9, "global/rounds_to_target": 10.0, "uplink_MB": 3.0},
             {"global/accuracy": 0.8, "global/rounds_to_target": float("nan"), "uplink_MB": 3.0}]]
  rows = sweep.aggregate([{}], finals)
  assert rows[0]["mean"]["global/rounds_to_target"] == 10.0 and rows[0]["reached"] == {
    "global/rounds_to_target": 1}
  never = sweep.aggregate([{}], [[{"global/rounds_to_target": float("nan")}] * 2])
  results = {"fedavg": {"sweep": {"settings": rows}}, "slow": {"sweep": {"settings": never}}}
  table = sweep.format_runs_table(results, ("global/accuracy", "uplink_MB", "global/rounds_to_target"))
  lines = table.splitlines()
  assert lines[1] == "runs (mean ± std over seeds)"
  assert lines[2].split() == ["run", "seeds", "accuracy", "up", "MB", "rounds", "to", "target"]
  assert lines[-2].split() == ["fedavg", "2", "0.850", "±", "0.050", "3.00", "±", "0.00", "10.0", "±",
                               "0.0", "(1/2", "seeds)"]
  assert lines[-1].split() == ["slow", "2", "-", "-", "-"]
