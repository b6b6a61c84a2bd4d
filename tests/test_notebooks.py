"""Every notebook in colab/ runs top to bottom (shrunk by FEDTREE_NOTEBOOK_SMOKE=1)."""

import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.ipynb")))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, monkeypatch):
  import matplotlib

  matplotlib.use("Agg")
  monkeypatch.setenv("FEDTREE_NOTEBOOK_SMOKE", "1")
  monkeypatch.chdir(os.path.dirname(path))
  nb = nbformat.read(path, as_version=4)
  scope: dict = {"__name__": "__notebook__"}
  for i, cell in enumerate(nb.cells):
    if cell.cell_type != "code":
      continue
    src = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
    exec(compile(src, f"{os.path.basename(path)}[cell {i}]", "exec"), scope)


def test_there_is_a_notebook():
  assert NOTEBOOKS
