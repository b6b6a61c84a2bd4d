"""A finished run is never lost for a missing plotting library (issue 42 item 1): every shipped
config's reporting path (its algorithm's report, the final table, ``summary.json``, the sweep
table, the pictures) runs with matplotlib unimportable; the results are written and each
picture skipped with one line naming the extra to install.

matplotlib is made unimportable by ``sys.modules["matplotlib"] = None`` (``import`` raises
``ImportError``, ``importlib.util.find_spec`` returns ``None``: what a fresh ``pip install -e .``
gives). Each config runs one round of the run whose report is its own (``only``), all of
them ``slow``; the pieces that skip a picture have fast tests of their own."""

import json
import os
import sys

import numpy as np
import pytest
from config_files import load_config

from fedtree.experiment import runner, workdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))
EXTRA = 'pip install -e ".[plot]"'

# (config, variant, the run(s) to keep: the one whose report is the config's own)
CASES = [
  ("baselines", None, "qffl"),                  # the related-work table: fairness, rounds to a target
  ("bhfl", None, "bhfl"),                       # the per-level report (bhfl_levels_*.md)
  ("clustered", None, "ifca"),                  # intra/inter-cluster accuracy
  ("compression", None, "top1"),                # bytes: accuracy against uplink
  ("fedkws", None, "fedkws_ui"),                # false accepts and rejects
  ("group_personalized", None, "grouppfl"),     # paper 000's report and its Fig. 1 histogram
  ("group_personalized_lm", None, "grouppfl"),  # the same for a language model
  ("heterogeneous", None, "heterofl"),          # a model per width (width_1 ... own_width)
  ("mobility", None, "fail_reassociate"),       # membership_<run>.npz and its picture, peak edge MB
  ("own_data", None, "fedavg"),                 # per-client fairness from .npz arrays
  ("peft_lm", None, "lora"),                    # pretraining, then LoRA adapters
  ("personalization", None, "ditto"),           # personal models
  ("personalized", None, "fedrep_path"),        # personal parameters: the personal and global columns
  ("pfedmt_mnist", "digits", "pfedmt"),         # global, team and device models
  ("pfedmt_synthetic", None, "pfedmt"),
  ("privacy", None, "eps10"),                   # epsilon per round
  ("privacy", "sweep", None),                   # a privacy sweep: its table and privacy-utility plot
  ("quickstart", None, "hierfavg"),             # a tree
  ("quickstart", "seeds", "fedavg"),            # a sweep over seeds: its table and plot
  ("robust", None, "backdoor_median_10"),       # attack success rate
  ("secure", None, "ddg16_eps10"),              # distributed DP: epsilon per round, secure bytes
  ("systems", None, "fedbuff"),                 # a simulated clock
  ("tuning", None, "fedavg"),                   # a study: its table, tuning_fedavg.csv, best_fedavg.py
]
FAST: set = set()
"""Cases of the default run: none, each takes 15-60 s; the three pieces that skip a picture
have fast tests of their own below."""


@pytest.fixture
def no_matplotlib(monkeypatch):
  """matplotlib (and its pyplot) unimportable, as on a fresh ``pip install -e .``."""
  for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def test_every_shipped_config_has_a_case():
  assert sorted({name for name, _, _ in CASES}) == CONFIGS


def _arrays(tmp_path) -> str:
  """A small ``.npz`` of 6 clients in 2 groups (configs/own_data.py reads a user's file)."""
  from fedtree.core.data import from_client_arrays
  from fedtree.datasets.arrays import save_arrays

  rng = np.random.default_rng(0)
  train = [(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32))
           for n in (12, 9, 14, 10, 8, 11)]
  test = [(x[:3] + 1, y[:3]) for x, y in train]
  return save_arrays(str(tmp_path / "clients.npz"), from_client_arrays(train, test, num_classes=3),
                     groups=[0, 0, 0, 1, 1, 1])


def shrunk(name: str, variant: str | None, only: str | None, tmp_path):
  """``configs/<name>.py:<variant>``: one round of the runs ``only`` (stages and pretraining cut
  to one round or two steps)."""
  c = load_config(name, *([variant] if variant else []))
  c.rounds, c.eval_every, c.rounds_per_call, c.progress = 1, 1, 1, False
  if only is not None:
    c.only = only
  for run in c.runs.values():
    for field in ("global_rounds", "group_rounds", "rounds"):
      if field in run:
        run[field] = 1
  if c.get("pretrain", None) is not None:
    c.pretrain.steps = 2
  if c.data.name == "stdlib_text":   # the language models: fewer sentences and words, a small LSTM
    c.data.max_sentences, c.data.vocab_size = 8, 200
    c.model.embed, c.model.hidden = 8, 16
    for run in c.runs.values():
      run.finetune.epochs = 1
    if c.get("pretrain", None) is not None:
      c.pretrain.packages, c.pretrain.max_sentences = ("json",), 4
  if name == "own_data":
    c.data.path = _arrays(tmp_path)
  if name == "quickstart":   # the default run's case: 5 clients
    c.data.group_sizes, c.data.dim, c.data.max_examples, c.data.test_examples = (3, 2), 6, 16, 4
    c.model.hidden = (4,)
    for run in c.runs.values():
      run.cohort_size = 2
  return c


@pytest.mark.parametrize("name,variant,only", [
  case if case[:2] in FAST else pytest.param(*case, marks=pytest.mark.slow) for case in CASES],
  ids=[f"{n}:{v}" if v else n for n, v, _ in CASES])
def test_a_config_reports_without_matplotlib(tmp_path, capsys, no_matplotlib, name, variant, only):
  c = shrunk(name, variant, only, tmp_path)
  work = tmp_path / "work"
  results = runner.train_and_evaluate(c, str(work))
  out, err = capsys.readouterr()
  files = sorted(os.listdir(work))
  summary = json.loads((work / "summary.json").read_text())
  assert set(summary) >= {label for label, _ in runner.selected_runs(runner.prepare_config(c))}
  assert results.keys() == summary.keys()
  assert not [f for f in files if f.endswith(".png")], files
  notes = [line for line in err.splitlines() if "matplotlib is not installed" in line]
  assert notes and all(EXTRA in line for line in notes), err[-3000:]
  if c.get("plots", True):   # (configs/personalized.py turns the run's pictures off: its sweep's are drawn)
    assert f"note: matplotlib is not installed, so no plot_*.png ({EXTRA})" in notes
  swept = c.sweep.params or int(c.sweep.seeds) > 1
  if swept:
    assert "sweep of run" in out
    for label in summary:
      assert any(f"no sweep_{label}.png" in line for line in notes), notes
  else:
    assert "Final evaluation" in out
  if name.startswith("group_personalized"):   # paper 000's tables are written, its histogram is not
    report = (work / "grouppfl_report.md").read_text()
    assert "per group" in report
    assert f'note: matplotlib is not installed, so no grouppfl_fig1.png ({EXTRA})' in report


def test_the_group_report_keeps_its_tables_without_matplotlib(tmp_path, no_matplotlib):
  """Paper 000's report (GroupPerFL vs PerFL): what lost configs/group_personalized.py's run."""
  from fedtree.algorithms.hierarchical.grouppfl import report

  summary = {
    "accuracy": 0.5, "perplexity": 2.0, "group_accuracy": np.array([0.25, 1.0]),
    "group_perplexity": np.array([3.0, 1.5]), "client_perplexity": np.array([2.0, 4.0, 1.0]),
    "client_costs": {"transfers": np.array([2.0, 4.0, 6.0]), "epochs": np.array([1.0, 2.0, 3.0])},
  }
  better = dict(summary, client_perplexity=np.array([1.0, 5.0, 0.5]))
  text = report.write_reports(str(tmp_path), {"PerFL": summary, "GroupPerFL": better},
                              groups=np.array([0, 0, 1]), group_names=("big", "small"))
  assert "| big | 2 | 25.00 | 25.00 |" in text and "of 3 clients improve perplexity" in text
  assert f"note: matplotlib is not installed, so no grouppfl_fig1.png ({EXTRA})" in text
  assert sorted(os.listdir(tmp_path)) == ["grouppfl_report.md"]


def test_the_run_pictures_are_one_line_without_matplotlib(tmp_path, no_matplotlib):
  import ml_collections

  from fedtree.experiment.reporting import Reporter

  (tmp_path / "metrics.jsonl").write_text('{"run": "a", "round": 1, "global/accuracy": 0.5}\n')
  lines = []
  reporter = Reporter.silent()
  reporter.print = lines.append
  workdir.write_plots(str(tmp_path), ml_collections.ConfigDict({"plots": True}), reporter)
  assert lines == [f"note: matplotlib is not installed, so no plot_*.png ({EXTRA})"]


def test_a_sweep_table_is_kept_without_matplotlib(tmp_path, capsys, no_matplotlib):
  from fedtree.experiment import sweep

  (tmp_path / "metrics.jsonl").write_text(
    '{"run": "a", "round": 1, "setting": {}, "seed": 0, "global/accuracy": 0.5}\n')
  rows = [{"setting": {}, "name": "default", "seeds": 1, "mean": {"global/accuracy": 0.5},
           "std": {"global/accuracy": 0.0}}]
  out = sweep.write_outputs(str(tmp_path), "a", rows, "global/accuracy")
  assert out["best"]["mean"] == 0.5
  err = capsys.readouterr().err
  assert err.strip() == f"note: matplotlib is not installed, so no sweep_a.png ({EXTRA})"
  assert not (tmp_path / "sweep_a.png").exists()
