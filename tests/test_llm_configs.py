"""The shipped LLM configs (configs/llm/: FlowerTune's four challenges, pfl-research's Aya and Alpaca),
each run shrunk on a tiny random checkpoint and mock rows of its dataset's schema (issue 50); a missing
dataset is one line naming its preparation; the communication budget is reported."""

import os

import numpy as np
import pytest

pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[llm]')")
pytest.importorskip("torch")

import llm_fixtures as F  # noqa: E402
from config_files import load_config  # noqa: E402

CONFIGS = {
  "flowertune_general_nlp": (F.alpaca_rows, {"mmlu": F.mmlu_rows}),
  "flowertune_finance": (F.alpaca_rows, {"fpb": F.alpaca_rows, "fiqa": F.alpaca_rows, "tfns": F.alpaca_rows}),
  "flowertune_medical": (
    F.alpaca_rows,
    {"pubmedqa": F.alpaca_rows, "medmcqa": F.medmcqa_rows, "medqa": None},
  ),
  "flowertune_code": (F.alpaca_rows, {}),
  "pfl_aya": (lambda: F.aya_rows(40), {}),
  "pfl_alpaca": (lambda: F.alpaca_rows(40), {}),
}


def _medqa_rows(n=4):
  rows = F.mmlu_rows(n)
  return {
    "question": rows["question"],
    "options": [dict(zip("ABCD", c, strict=True)) for c in rows["choices"]],
    "answer_idx": ["ABCD"[a] for a in rows["answer"]],
  }


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tiny_llama"))
  F.tiny_checkpoint(path, layers=1)
  return path


def shrunk(name, checkpoint, tmp_path):
  """Config ``llm/<name>`` on the tiny checkpoint and mock rows: 1 round, 4 clients (2 per round), 1 local
  step of 2 sequences of 128 tokens, rank-2 adapters, 3 questions per benchmark."""
  c = load_config(f"llm/{name}")
  rows, tasks = CONFIGS[name]
  c.model.checkpoint = checkpoint
  c.data.path = F.save(rows(), str(tmp_path / "data"))
  c.data.seq_len, c.data.test_fraction = 128, 0.25
  if c.data.partitioner == "iid":
    c.data.partitioner_args.num_clients = 4
  if c.data.partitioner == "poisson":
    c.data.partitioner_args.mean = 8
  c.rounds, c.eval_every, c.progress, c.plots = 1, 1, False, False
  c.local.batch_size, c.local.steps, c.local.epochs = 2, 1, None
  for run in c.runs.values():
    run.cohort_size = 2
    run.adapters.rank, run.adapters.alpha = 2, 4.0
  for task, make in tasks.items():
    c.tasks[task].path = F.save((make or _medqa_rows)(), str(tmp_path / task))
    c.tasks[task].seq_len, c.tasks[task].limit = 128, 3
  return c


@pytest.mark.slow
def test_general_nlp_end_to_end(checkpoint, tmp_path, capsys):
  """FlowerTune's general NLP challenge, shrunk: adapters on the int8 base trained a round; the global
  model scored on MMLU (log-likelihood), every client's perplexity on its own held-out examples, the
  bytes sent (adapters only) and a budget the run exceeds, reported (~30 s of CPU: slow; the pieces
  run in the default set: tests/test_llm_data.py, test_llm_cohort.py, the refusals below)."""
  from fedtree import experiment

  c = shrunk("flowertune_general_nlp", checkpoint, tmp_path)
  c.communication_budget_MB = 1e-6
  results = experiment.train_and_evaluate(c, str(tmp_path / "work"))
  s = results["fedavg"]["global"]
  assert 0.0 <= s["mmlu_accuracy"] <= 1.0 and np.isfinite(s["perplexity"])
  assert np.asarray(s["client_perplexity"]).shape == (4,)
  adapters = 4 * 2 * (32 + 32 + 32 + 16)  # float32 rank-2 A, B on q_proj (32 -> 32) and v_proj (32 -> 16)
  assert s["uplink_MB"] * 1e6 == pytest.approx(2 * adapters) and s["communication_MB"] > s["uplink_MB"]
  assert s["over_budget"] is True and s["communication_budget_MB"] == 1e-6
  assert "over its communication budget of" in capsys.readouterr().out


def test_a_budget_not_exceeded_is_reported_so(checkpoint, tmp_path):
  from fedtree.experiment.llm import budget_summary

  fields, warning = budget_summary("r", {"uplink_MB": 1.0, "downlink_MB": 2.0}, 200000.0)
  assert fields == {"communication_MB": 3.0, "communication_budget_MB": 200000.0, "over_budget": False}
  assert warning == ""
  assert budget_summary("r", {}, 1.0) == ({}, "")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_missing_dataset_is_refused_in_one_line(name, checkpoint, tmp_path):
  from fedtree.experiment import runner

  c = load_config(f"llm/{name}")
  c.model.checkpoint = checkpoint
  c.data.path = str(tmp_path / "absent")
  with pytest.raises(
    FileNotFoundError,
    match=r"^config.data.path='.*absent' does not exist; prepare it where "
    r"the Hub is reachable: python -c .*save_to_disk",
  ):
    runner.make_context(c)
  assert c.data.tokenizer == checkpoint  # the data's tokenizer follows --config.model.checkpoint


def test_a_benchmark_without_a_path_is_not_scored_and_a_wrong_one_is_refused(checkpoint, tmp_path):
  from fedtree.experiment import runner

  c = shrunk("flowertune_medical", checkpoint, tmp_path)
  c.tasks.medqa.path = None
  ctx = runner.make_context(c)
  assert sorted(ctx.tasks) == ["medmcqa", "pubmedqa"]
  c.tasks.medqa.path = str(tmp_path / "nowhere")
  with pytest.raises(
    FileNotFoundError,
    match=r"config.tasks.medqa.path='.*nowhere' does not exist; prepare it "
    r".*'GBaker/MedQA-USMLE-4-options'",
  ):
    runner.make_context(c)
  c.tasks.medqa.path = None
  c.tasks.medmcqa.kind = "rank"
  with pytest.raises(ValueError, match=r"config.tasks.medmcqa.kind='rank'; choose one of \('choice', "):
    runner.make_context(c)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_llm_config_runs_shrunk(name, checkpoint, tmp_path):
  """Every config, shrunk, trains a round and scores its global model on its benchmarks (~20-60 s each
  on the 2-core CPU)."""
  from fedtree import experiment

  c = shrunk(name, checkpoint, tmp_path)
  results = experiment.train_and_evaluate(c, str(tmp_path / "work"))
  for label in c.runs:
    s = results[label]["global"]
    assert np.isfinite(s["perplexity"]) and s["uplink_MB"] > 0
    for task in CONFIGS[name][1]:
      key = f"{task}_accuracy" if c.tasks[task].kind == "choice" else f"{task}_exact_match"
      assert 0.0 <= s[key] <= 1.0, (label, key)
  assert os.path.exists(tmp_path / "work" / "summary.json")
