"""The composition matrix (issue 55): ``docs/compositions.md`` is what the code does, cell for cell.

The default run draws :data:`FUZZ` seeded cells of the page (algorithm x capability), probes each as
the runner builds a run, and checks the verdict is the page's: a ✓ cell is built and trains two rounds
to a finite state whose models cover every client, a ✗ cell is refused with the reason the page
lists, a · cell names the section or field the algorithm does not take. ``-m slow`` probes every cell
and compares the whole page, reasons included (``python -m fedtree.experiment.compositions --write``
regenerates it)."""

import pathlib

import jax
import numpy as np
import pytest

from fedtree.core import loop
from fedtree.experiment import compositions, registry

PAGE = pathlib.Path(__file__).resolve().parent.parent / compositions.PAGE
FUZZ = 16


def _page():
  return PAGE.read_text()


def test_the_page_has_every_algorithm_and_every_column():
  cells = compositions.read_page(_page())
  assert {n for n, _ in cells} == set(registry.SPECS)
  assert {c for _, c in cells} == set(compositions.COLUMNS)
  assert set(cells.values()) <= {compositions.YES, compositions.REFUSED, compositions.NOT_TAKEN}


def _drawn():
  rng = np.random.default_rng(55)
  cells = sorted(compositions.read_page(_page()))
  return [cells[i] for i in rng.choice(len(cells), size=FUZZ, replace=False)]


@pytest.mark.parametrize("name,column", _drawn())
def test_a_drawn_cell_does_what_the_page_says(name, column):
  mark = compositions.read_page(_page())[name, column]
  refusal, run = compositions.probe(name, column)
  if mark != compositions.YES:
    assert refusal is not None, f"{name} x {column}: the page says {mark}, the run was built"
    text = compositions.reason(name, refusal)
    assert compositions.symbol(text) == mark, (name, column, text)
    if mark == compositions.REFUSED:
      assert text.replace("|", "\\|") in _page(), f"{name} x {column}: reason not on the page: {text}"
    return
  assert refusal is None, f"{name} x {column}: the page says ✓, refused: {refusal}"
  state = loop.run(run.algorithm, run.context.run_data, num_rounds=run.rounds, key=jax.random.key(0))
  assert int(state.round) == run.rounds
  n = run.context.data.num_clients
  for model, nm in run.algorithm.models(state).items():
    for leaf in jax.tree.leaves(nm.params):
      assert np.isfinite(np.asarray(leaf)).all(), (name, column, model)
    owner = np.asarray(nm.model_of_client)
    assert owner.shape == (n,) and owner.min() >= 0, (name, column, model)


def test_a_reason_loses_the_label_and_the_method_name_only():
  assert compositions.reason("cfl", "config.runs.cell (algorithm='cfl'): cfl cannot use aggregator 'krum': "
                                    "it aggregates") == "cannot use aggregator 'krum': it aggregates"
  assert compositions.reason("scaffold", "config.runs.cell (algorithm='scaffold'): scaffold: a robust "
                                         "aggregator") == "a robust aggregator"
  assert compositions.reason("cfl", "config.runs.cell: unknown field 'systems': algorithm 'cfl' cannot run "
                                    "a 'systems' section (devices); the algorithms that take it: [..]") == (
    "takes no 'systems' section")
  assert compositions.reason("cfl", "config.runs.cell (algorithm='cfl'): unknown field 'poisson_q'; "
                                    "allowed fields: ['a']") == "takes no 'poisson_q' field"
  assert compositions.reason("fedasync", "config.runs.cell (algorithm='fedasync'): unknown field "
                                         "'cohort_size' (did you mean 'chunk_size'?); allowed fields: "
                                         "['a']") == (
    "takes no 'cohort_size' field")   # (a suggestion does not make it a refusal)


def test_a_cell_of_an_unknown_algorithm_or_column_is_refused_by_name():
  with pytest.raises(ValueError, match="algorithm='nope'.*choose one of"):
    compositions.cell_config("nope", "median")
  with pytest.raises(ValueError, match="column='medain'.*choose one of"):
    compositions.cell_config("fedavg", "medain")


@pytest.mark.slow
def test_the_page_is_what_the_code_does():
  text = compositions.page(compositions.matrix())
  if text != _page():
    old, new = compositions.read_page(_page()), compositions.read_page(text)
    moved = sorted(k for k in new if old.get(k) != new[k])
    pytest.fail(f"docs/compositions.md differs from the code at {moved or 'the reasons only'}; "
                f"regenerate it: python -m fedtree.experiment.compositions --write")


def test_the_readme_states_the_pages_count():
  """The README quotes how many cells run: the page's count (which the slow test ties to the code)."""
  import re

  page = re.search(r"\*\*(\d+) of (\d+)\*\* cells are ✓", _page())
  readme = (PAGE.parent.parent / "README.md").read_text()
  assert page and f"{page.group(1)} of {page.group(2)} cells run" in readme
