"""benchmarks.config_figures: a config's docstring figures against what the config prints.

The fast tests check the table machinery on made-up results; the slow ones run every config
that declares ``FIGURES`` (its full run: about 1 min for group_personalized, 3 min for fedkws
on the 2-core machine) and fail when a printed figure leaves the docstring's by more than its
column's tolerance."""

import glob
import math
import os
import subprocess
import sys

import pytest

from benchmarks import config_figures as cf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITH_FIGURES = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                      if "\nFIGURES = (" in open(p, encoding="utf-8").read())
# a config's variants with tables of their own (its module-level FIGURE_VARIANTS)
WITH_FIGURES += [f"{p}:{v}" for p in list(WITH_FIGURES)
                 for v in getattr(cf.load_module(p), "FIGURE_VARIANTS", ())]
COLUMNS = [cf.Column("acc%", "accuracy", 100, 2, 0.5), cf.Column("epochs", "costs.epochs", 1, 1, 0.0),
           cf.Column("n", lambda models, m: len(models), 1, 0, 0)]
RESULTS = {"fedavg": {"global": {"accuracy": 0.51234, "costs": {"epochs": 9.25}}},
           "ditto": {"global": {"accuracy": 0.4}, "personal": {"accuracy": 0.6, "costs": {"epochs": 3.0}}}}


def test_the_configs_with_figures_are_found():
  assert {os.path.basename(p) for p in WITH_FIGURES} >= {"fedkws.py", "group_personalized.py"}


def test_all_finds_every_config_with_figures_and_quick_a_subset_of_them(capsys):
  every = cf.with_figures()
  assert sorted(every) == sorted(WITH_FIGURES)
  quick = cf.with_figures(quick=True)
  assert quick and set(quick) < set(every)
  assert {os.path.basename(cf.split_variant(p)[0])[:-3] for p in quick} == set(cf.QUICK)
  for argv, message in [([], "give --config=<file> or --all"), (["--all", "--write"], "--write rewrites one"),
                        (["--config=configs/quickstart.py", "--quick"], "--quick is for --all")]:
    with pytest.raises(SystemExit):
      cf.main(argv)
    assert message in capsys.readouterr().err


def test_a_table_is_written_as_printed_and_read_back():
  rows = cf.measure(RESULTS, COLUMNS)
  assert rows[("fedavg", "global")] == [51.23, 9.2, 1.0]  # scaled, rounded as printed
  assert math.isnan(rows[("ditto", "global")][1])         # no cost: "-"
  table = cf.format_table(rows, COLUMNS)
  assert table.splitlines()[0].split() == ["run", "model", "acc%", "epochs", "n"]
  assert "\n  ditto   global    40.00  -       2\n" in table
  back = cf.parse_table(table, COLUMNS)
  assert back.keys() == rows.keys()
  assert cf.compare(back, rows, COLUMNS) == []


def test_untrained_models_are_not_figures():
  results = {"edges": {"global": {"accuracy": 0.05, "trained": False}, "level1": {"accuracy": 0.5}}}
  assert list(cf.measure(results, COLUMNS[:1])) == [("edges", "level1")]


def test_compare_names_every_figure_beyond_its_tolerance_and_every_missing_row():
  printed = cf.measure(RESULTS, COLUMNS)
  stated = {k: list(v) for k, v in printed.items()}
  stated[("fedavg", "global")][0] += 0.5        # at the tolerance: holds
  assert cf.compare(stated, printed, COLUMNS) == []
  stated[("fedavg", "global")][0] += 0.02       # beyond it
  stated[("ditto", "personal")][1] = 4.0        # tolerance 0
  del stated[("ditto", "global")]
  stated[("gone", "global")] = [1.0, 1.0, 1.0]
  problems = cf.compare(stated, printed, COLUMNS)
  assert problems == [
    "gone global: in the docstring, not printed",
    "fedavg global acc%: docstring 51.75, printed 51.23 (tolerance 0.5)",
    "ditto global: printed, not in the docstring",
    "ditto personal epochs: docstring 4.0, printed 3.0 (tolerance 0.0)",
  ]


def test_write_replaces_only_the_table_after_the_command(tmp_path):
  path = tmp_path / "cfg.py"
  path.write_text('"""Doc.\n\n  python -m fedtree.main --config=x\n\n'
                  'Figures (`python -m benchmarks.config_figures`):\n\n'
                  '  run  model  acc%\n  old  row    1.00\n\nAfter.\n"""\n'
                  'FIGURES = (("acc%", "accuracy", 100, 2, 0.5),)\n')
  problems, _ = cf.check(str(path), results={"fedavg": {"global": {"accuracy": 0.5}}})
  assert problems == ["old row: in the docstring, not printed",
                      "fedavg global: printed, not in the docstring"]
  cf.check(str(path), write=True, results={"fedavg": {"global": {"accuracy": 0.5}}})
  text = path.read_text()
  assert "  python -m fedtree.main --config=x\n" in text and "old" not in text and "\nAfter.\n" in text
  assert cf.check(str(path), results={"fedavg": {"global": {"accuracy": 0.504}}})[0] == []


def test_a_variant_has_its_own_table(tmp_path):
  """``path:variant`` runs ``get_config(variant)`` and reads / writes the table after the line naming
  the command with that variant; the plain path keeps the first table."""
  path = tmp_path / "cfg.py"
  path.write_text('"""Doc.\n\n`python -m benchmarks.config_figures --config=cfg.py`:\n\n'
                  '  run  model  acc%\n  a    global  50.00\n\n'
                  '`python -m benchmarks.config_figures --config=cfg.py:tree`:\n\n'
                  '  run  model  acc%\n  b    global  60.00\n"""\n'
                  'FIGURES = (("acc%", "accuracy", 100, 2, 0.5),)\n')
  assert cf.split_variant(f"{path}:tree") == (str(path), "tree") and cf.split_variant(str(path))[1] is None
  assert cf.check(str(path), results={"a": {"global": {"accuracy": 0.5}}})[0] == []
  assert cf.check(f"{path}:tree", results={"b": {"global": {"accuracy": 0.6}}})[0] == []
  cf.check(f"{path}:tree", write=True, results={"c": {"global": {"accuracy": 0.7}}})
  text = path.read_text()
  assert "  a    global  50.00\n" in text and "  c    global  70.00\n" in text and "  b  " not in text
  with pytest.raises(ValueError, match="names no `benchmarks.config_figures --config=...:deep`"):
    cf.check(f"{path}:deep", results={})


def test_a_config_without_figures_is_refused():
  with pytest.raises(ValueError, match="declares no FIGURES"):
    cf.columns_of(cf.load_module(os.path.join(ROOT, "configs", "quickstart.py")))


TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
"""What tests/conftest.py adds to XLA_FLAGS to compile tests faster: it changes float results, so a
config's figures are checked without it, as a user's run compiles."""


@pytest.mark.slow
@pytest.mark.parametrize("path", WITH_FIGURES, ids=os.path.basename)  # (variants: "name.py:variant")
def test_printed_figures_match_the_docstring(path):
  """The config's run as ``python -m benchmarks.config_figures`` makes it, in a process of its own
  with XLA's default optimization (fedkws's 30 rounds move by up to 0.6 accuracy points under the
  tests' unoptimized compilation)."""
  env = {**os.environ, "XLA_FLAGS": " ".join(
    f for f in os.environ.get("XLA_FLAGS", "").split() if f not in TEST_XLA_FLAGS)}
  proc = subprocess.run([sys.executable, "-m", "benchmarks.config_figures", f"--config={path}"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0 and "figures hold" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
