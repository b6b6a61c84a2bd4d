"""The documentation: the MkDocs site builds in strict mode (a broken reference, a page missing
from the navigation or a bad docstring cross-reference fails), and the examples in the public
entry points' docstrings run as doctests."""

import doctest
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The public entry points whose docstrings carry a runnable example. Every algorithm factory's
# example runs one round of one tiny problem (5 clients, logistic regression, 1 local step); its
# cost is the compilation of one round program, ~4-5 s of CPU each (measured on the 2-core dev
# machine), so the default run keeps the core modules and three representative entry points
# (~25 s together) and the other factories run under -m slow.
DOCTEST_MODULES = [
  "fedtree.core.algorithm",    # FederatedAlgorithm
  "fedtree.core.topology",     # Topology
  "fedtree.core.data",         # FederatedData
  "fedtree.core.tier",         # train_cohort
  "fedtree.core.loop",         # loop.run
  "fedtree.core.systems",      # Systems.round (no compilation of a round)
  "fedtree.evaluation.plots",  # write_run_plots
  "fedtree.algorithms.hierfavg",           # fedavg, hierfavg
  "fedtree.algorithms.grouppfl.grouppfl",  # GroupPersonalizedFL
  "fedtree.experiment.runner",             # train_and_evaluate
]
SLOW_DOCTEST_MODULES = [
  "fedtree.algorithms.fedprox",
  "fedtree.algorithms.fedmmd",
  "fedtree.algorithms.ditto",
  "fedtree.algorithms.pfedme",
  "fedtree.algorithms.perfedavg",
  "fedtree.algorithms.pfedmt",
  "fedtree.algorithms.bhfl.bhfl",
  "fedtree.algorithms.clustering.clustered",
  "fedtree.algorithms.clustering.cfl",
  "fedtree.algorithms.clustering.awcfl",
  "fedtree.algorithms.clustering.mcfl",
  "fedtree.algorithms.clustering.ifca",
  "fedtree.algorithms.fedkws.fedkws",
  "fedtree.algorithms.fedbuff",
]


def test_every_algorithm_factory_has_a_runnable_example():
  """Each factory exported by fedtree.algorithms (and GroupPersonalizedFL) carries an example
  in a module whose doctests run above."""
  import fedtree.algorithms as algorithms
  from fedtree.algorithms.grouppfl.grouppfl import GroupPersonalizedFL

  listed = set(DOCTEST_MODULES + SLOW_DOCTEST_MODULES)
  factories = [getattr(algorithms, n) for n in algorithms.__all__ if n[0].islower()]
  for f in factories + [GroupPersonalizedFL]:
    assert ">>>" in (f.__doc__ or ""), f"{f.__name__} has no docstring example"
    assert f.__module__ in listed, f"{f.__module__} ({f.__name__}) is not in the doctest lists"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason='mkdocs is not installed (pip install -e ".[docs]")')
def test_site_builds_in_strict_mode(tmp_path):
  out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert out.returncode == 0, out.stderr[-4000:]
  for page in ("index.html", "concepts/index.html", "algorithms/bhfl/index.html", "api/core/index.html"):
    assert (tmp_path / "site" / page).exists(), page
  api = (tmp_path / "site" / "api" / "core" / "index.html").read_text()
  assert "train_cohort" in api and "Topology" in api


@pytest.mark.parametrize("name", DOCTEST_MODULES + [pytest.param(m, marks=pytest.mark.slow)
                                                    for m in SLOW_DOCTEST_MODULES])
def test_docstring_examples_run(name):
  if name == "fedtree.evaluation.plots":
    pytest.importorskip("matplotlib")
  flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  result = doctest.testmod(importlib.import_module(name), optionflags=flags, verbose=False)
  assert result.attempted > 0, f"{name} has no docstring example"
  assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"
