"""End-to-end run of configs/personalization.py, shrunk."""


from config_files import load_config

from fedtree import experiment


def test_personalization_config_end_to_end(tmp_path):
  c = load_config("personalization")
  c.rounds = 2
  c.eval_every = 2
  c.rounds_per_call = 2
  c.progress = False
  c.data.group_sizes = (3, 2)
  c.data.dim = 4
  c.data.num_classes = 3
  c.data.mean_examples = 6.0
  c.data.max_examples = 10
  c.data.test_examples = 3
  c.model.hidden = (4,)
  for run in c.runs.values():
    run.cohort_size = 2
  results = experiment.train_and_evaluate(c, str(tmp_path))
  assert set(results["ditto"]) == {"global", "personal"}
  assert set(results["pfedme"]) == {"global", "personal"}
  assert set(results["perfedavg_hf"]) == {"global", "adapted"}
  for models in results.values():
    for s in models.values():
      assert 0.0 <= s["accuracy"] <= 1.0
