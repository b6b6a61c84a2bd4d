"""Every notebook in colab/ runs top to bottom, shrunk by its ``SMALL`` switch (the test sets
``FEDTREE_NOTEBOOK_SMOKE=1``), and opens as a reader expects: an "Open in Colab" badge, then an
install cell that does nothing where fedtree is importable; committed executed, with outputs
(``pip install -e ".[notebooks]"`` then ``jupyter nbconvert --to notebook --execute --inplace
colab/<name>.ipynb``)."""

import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.ipynb")))
PAPER_NOTEBOOKS = [p for p in NOTEBOOKS if os.path.basename(p)[:3].isdigit()]


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
  if path in PAPER_NOTEBOOKS:
    assert scope["SMALL"] is True
    matplotlib.pyplot.close("all")


def test_there_is_a_notebook_per_paper():
  names = [os.path.basename(p) for p in PAPER_NOTEBOOKS]
  assert [n[:3] for n in names] == ["000", "001", "002", "003", "004", "005"], names


@pytest.mark.parametrize("path", PAPER_NOTEBOOKS, ids=os.path.basename)
def test_notebook_opens_with_a_badge_and_a_guarded_install_cell(path):
  nb = nbformat.read(path, as_version=4)
  first, install = nb.cells[0], nb.cells[1]
  name = os.path.basename(path)
  assert first.cell_type == "markdown"
  assert "colab.research.google.com/assets/colab-badge.svg" in first.source
  assert f"/colab/{name})" in first.source
  assert install.cell_type == "code"
  assert 'find_spec("fedtree") is None' in install.source and "pip" in install.source
  assert "raise SystemExit" in install.source and "github.com" not in install.source  # no guessed address


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_committed_executed(path):
  """A reader on GitHub sees what the notebook printed and drew: every code cell ran, in order,
  without an error, and the notebook shows at least one picture or table."""
  nb = nbformat.read(path, as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  counts = [c.get("execution_count") for c in code]
  assert all(n is not None for n in counts) and counts == sorted(counts), counts
  outputs = [o for c in code for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  assert any("image/png" in o.get("data", {}) or o.get("output_type") == "stream" for o in outputs)
