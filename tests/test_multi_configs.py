"""End-to-end runs of configs/bhfl.py and configs/pfedmt_*.py, shrunk by overrides."""

import json

import pytest
from config_files import load_config

from fedtree.experiment.runner import train_and_evaluate


def _small_bhfl():
  c = load_config("bhfl")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 4, 4, 4, False
  c.data.group_sizes = (6, 3, 2, 2)
  c.data.test_examples = 10
  c.topology.sizes = ((3, 3), (3, 2, 2))
  c.model.hidden = (8,)
  for run in c.runs.values():
    run.cohort_size = 2
    if "proxy_examples" in run:
      run.proxy_examples = 10
      run.periods = (2, 2, 1)
  c.runs.hierfavg.periods = (2, 2)
  c.runs.bhfl_async.buffer_sizes = (None, 1, 1)
  return c


def _check_bhfl_results(c, results, tmp_path):
  assert set(results) == set(c.runs.keys())
  for label in c.runs.keys():
    if label == "hierfavg":
      continue
    assert {"root", "level1", "level2", "client", "root@central"} <= set(results[label])
    rows = json.loads((tmp_path / f"bhfl_levels_{label}.json").read_text())
    assert [r["level"] for r in rows] == [0, 1, 2, 3]
    assert all(0.0 <= r["central_accuracy"] <= 1.0 for r in rows)
    assert (tmp_path / f"bhfl_levels_{label}.md").exists()


@pytest.mark.slow
def test_bhfl_config_end_to_end(tmp_path):
  c = _small_bhfl()
  _check_bhfl_results(c, train_and_evaluate(c, str(tmp_path)), tmp_path)


def test_bhfl_config_one_combined_run(tmp_path):
  """Fast variant: one run combining the async, residual and adaptive ablations' fields."""
  import ml_collections

  c = _small_bhfl()
  combined = ml_collections.ConfigDict(c.runs.bhfl_async.to_dict())
  for src in (c.runs.bhfl_residual, c.runs.bhfl_adaptive):
    for k, v in src.items():
      if k not in combined:
        combined[k] = v
  combined.residual_k = 1                      # the edges' buffer holds 1 update
  c.runs = ml_collections.ConfigDict({"combined": combined})
  _check_bhfl_results(c, train_and_evaluate(c, str(tmp_path)), tmp_path)


@pytest.mark.parametrize("variant", ["mlr", "dnn"])
def test_pfedmt_synthetic_config_end_to_end(tmp_path, variant):
  c = load_config("pfedmt_synthetic", variant)
  assert c.runs.pfedmt.gamma == (0.1 if variant == "mlr" else 1.0)
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 2, 2, 2, False
  c.data.num_clients, c.data.team_size, c.data.max_examples = 6, 3, 60
  c.local.steps = 2
  c.runs.pfedmt.team_iters = 2
  c.runs.pfedme.inner_steps = 2
  if variant == "dnn":
    assert tuple(c.model.hidden) == (20,)
  results = train_and_evaluate(c, str(tmp_path))
  assert set(results["pfedmt"]) == {"global", "team", "personal"}
  assert set(results["fedavg"]) == {"global"}
  assert {"global", "personal"} <= set(results["pfedme"])
  assert {"global", "adapted"} <= set(results["perfedavg"])
  for s in results["pfedmt"].values():
    assert 0.0 <= s["accuracy"] <= 1.0


def test_pfedmt_mnist_config_is_well_formed():
  from fedtree.experiment.registry import BUILDERS
  from fedtree.experiment.runner import validate_config

  for variant in ("mlr", "cnn"):
    c = load_config("pfedmt_mnist", variant)
    validate_config(c)
    assert c.data.name == "tfds" and c.data.num_clients == 20 and c.data.team_size == 10
    assert all(r.algorithm in BUILDERS for r in c.runs.values())
  assert load_config("pfedmt_mnist", "cnn").runs.pfedmt.lam == 3.0


@pytest.mark.parametrize("variant", ["mlr", "cnn"])
def test_pfedmt_mnist_config_runs_on_mocked_tfds(tmp_path, variant):
  tfds = pytest.importorskip("tensorflow_datasets")
  c = load_config("pfedmt_mnist", variant)
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 1, 1, 1, False
  c.data.num_clients, c.data.team_size = 4, 2
  c.local.steps = 1
  c.runs.pfedmt.team_iters = 1
  c.runs.pfedme.inner_steps = 1
  if variant == "cnn":
    c.model.features, c.model.dense = (2,), 4
  with tfds.testing.mock_data(num_examples=80, policy=tfds.testing.MockPolicy.USE_CODE):
    results = train_and_evaluate(c, str(tmp_path))
  assert list(results) == ["fedavg", "perfedavg", "pfedme", "pfedmt"]
  assert set(results["pfedmt"]) == {"global", "team", "personal"}


def test_pfedmt_mnist_digits_variant_is_well_formed():
  from fedtree.experiment.runner import validate_config

  for variant, model in (("digits", "logreg"), ("cnn+digits", "cnn")):
    c = load_config("pfedmt_mnist", variant)
    validate_config(c)
    assert (c.data.name, c.data.partition, c.data.alpha, c.data.team_size) == ("sklearn_digits", "dirichlet",
                                                                               0.1, 10)
    assert c.model.name == model and c.data.num_clients == 20
  with pytest.raises(ValueError, match="variant suffix 'emnist'"):
    load_config("pfedmt_mnist", "mlr+emnist")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["digits", "cnn+digits"])
def test_pfedmt_mnist_digits_config_end_to_end(tmp_path, variant):
  pytest.importorskip("sklearn")
  c = load_config("pfedmt_mnist", variant)
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 1, 1, 1, False
  c.data.num_clients, c.data.team_size, c.data.alpha = 4, 2, 1.0
  c.local.steps = 1
  c.runs.pfedmt.team_iters = 1
  c.runs.pfedme.inner_steps = 1
  if variant == "cnn+digits":
    c.model.features, c.model.dense = (2,), 4
  results = train_and_evaluate(c, str(tmp_path))
  assert list(results) == ["fedavg", "perfedavg", "pfedme", "pfedmt"]
  assert set(results["pfedmt"]) == {"global", "team", "personal"}
  assert all(0.0 <= s["accuracy"] <= 1.0 for s in results["pfedmt"].values())
