"""Issue 49 item 3, per-client state paged by client id: gathers and scatters equal a dense numpy
reference, a never-drawn client costs nothing, commits and restores give back a checkpoint's rows,
and a run killed with SIGKILL anywhere resumes bitwise."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorstore")

import paged_kill_driver as driver  # noqa: E402

from fedtree.population.paged import PagedSnapshot, PagedState  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "tests", "paged_kill_driver.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def init(ids):
  ids = np.asarray(ids)
  w = np.outer(ids, np.arange(6)).reshape(-1, 2, 3).astype(np.float32)
  return {"w": w, "n": (ids * 3).astype(np.int64)}


class Dense:
  """The reference: every client's row in a dense array, ``init``'s until written."""

  def __init__(self, num_clients):
    self.rows = init(np.arange(num_clients))

  def gather(self, ids):
    return {k: v[ids] for k, v in self.rows.items()}

  def scatter(self, ids, rows):
    for k in self.rows:
      self.rows[k][ids] = rows[k]


@pytest.mark.parametrize("where,chunk_bytes", [("memory", 1 << 20), ("disk", 1), ("disk", 200)])
def test_gather_and_scatter_match_a_dense_reference(tmp_path, where, chunk_bytes):
  c = 300
  directory = None if where == "memory" else str(tmp_path / "p")
  state = PagedState(init, c, directory=directory, chunk_bytes=chunk_bytes)
  ref = Dense(c)
  rng = np.random.default_rng(0)
  for r in range(8):
    ids = rng.choice(c, 25, replace=False)
    got, want = state.gather(ids), ref.gather(ids)
    for k in want:
      assert got[k].dtype == want[k].dtype
      np.testing.assert_array_equal(got[k], want[k])
    new = {"w": got["w"] * 2 + r, "n": got["n"] + r}
    state.scatter(ids, new)
    ref.scatter(ids, new)
    if where == "disk" and r % 3 == 2:
      state.commit()
  every = np.arange(c)
  for k, v in state.gather(np.concatenate([every, every[:5]])).items():   # repeats allowed
    np.testing.assert_array_equal(v, np.concatenate([ref.rows[k], ref.rows[k][:5]]))


def test_a_never_drawn_client_costs_nothing(tmp_path):
  calls = []

  def spied(ids):
    calls.append(np.asarray(ids).tolist())
    return init(ids)

  state = PagedState(spied, 1_000_000, directory=str(tmp_path / "p"), chunk_bytes=1)
  calls.clear()
  assert state.clients_per_chunk == 1 and state.num_written == 0
  rows = state.gather(np.array([10, 999_999]))
  assert calls == [[10, 999_999]] and state.num_written == 0
  state.scatter(np.array([10, 999_999]), rows)
  state.gather(np.array([10, 5]))
  assert calls[-1] == [5] and state.num_written == 2
  chunks = [f for d, _, fs in os.walk(tmp_path / "p") for f in fs if "/c/" in os.path.join(d, f)]
  assert len(chunks) == 2 * 2   # two clients, two leaves: the other 999,998 clients hold no file


def test_commit_and_restore_give_back_the_committed_rows(tmp_path):
  state = PagedState(init, 50, directory=str(tmp_path / "p"), chunk_bytes=40)
  ids = np.arange(0, 50, 3)
  state.scatter(ids, {"w": np.ones((len(ids), 2, 3), np.float32), "n": np.ones(len(ids), np.int64)})
  snap = state.commit()
  at_commit = state.gather(np.arange(50))
  state.scatter(ids[:4], {"w": np.zeros((4, 2, 3), np.float32), "n": np.zeros(4, np.int64)})
  state.scatter(np.array([1, 2]), {"w": np.full((2, 2, 3), 7, np.float32), "n": np.full(2, 7, np.int64)})
  # a new process: the same directory, the checkpoint's snapshot
  again = PagedState(init, 50, directory=str(tmp_path / "p"), chunk_bytes=40)
  again.restore(snap)
  for k, v in again.gather(np.arange(50)).items():
    np.testing.assert_array_equal(v, at_commit[k])
  assert again.generation == 1 and again.num_written == len(ids)


def test_checkpoint_refusals(tmp_path):
  memory = PagedState(init, 10)
  with pytest.raises(ValueError, match=r"host memory \(directory=None\) is not checkpointed"):
    memory.commit()
  with pytest.raises(ValueError, match="host memory .* has no checkpoint to restore"):
    memory.restore(memory.snapshot_like())
  state = PagedState(init, 10, directory=str(tmp_path / "p"))
  one = state.commit()
  state.scatter(np.array([3]), state.gather(np.array([4])))
  two = state.commit()
  state.scatter(np.array([3]), state.gather(np.array([5])))   # may write over commit 1's rows
  with pytest.raises(ValueError, match="the snapshot of commit 1 can no longer be restored .* written after "
                                       "commit 2"):
    state.restore(one)
  state.restore(two)
  with pytest.raises(ValueError, match=r"the snapshot holds \(9,\) slots; this paged state has 10 clients"):
    state.restore(PagedSnapshot(slots=np.zeros(9, np.uint8), generation=np.asarray(2)))
  with pytest.raises(ValueError, match="holds a paged state of 10 clients"):
    PagedState(init, 11, directory=str(tmp_path / "p"))


def test_row_refusals():
  state = PagedState(init, 10)
  rows = state.gather(np.array([1, 2]))
  with pytest.raises(ValueError, match="client id 2 appears more than once"):
    state.scatter(np.array([2, 2]), rows)
  with pytest.raises(ValueError, match=r"gather: client id 10 is outside the paged state's clients 0..9"):
    state.gather(np.array([10]))
  with pytest.raises(ValueError, match=r"scatter: client id -1 is outside"):
    state.scatter(np.array([-1, 1]), rows)
  with pytest.raises(ValueError, match=r"a leaf has shape \(2, 3\); need \(2, 2, 3\)"):
    state.scatter(np.array([1, 2]), {"w": np.zeros((2, 3), np.float32), "n": rows["n"]})
  with pytest.raises(ValueError, match="rows have structure"):
    state.scatter(np.array([1, 2]), {"w": rows["w"]})
  with pytest.raises(ValueError, match="init returned a leaf of shape"):
    PagedState(lambda ids: np.zeros((3, 2)), 10)
  with pytest.raises(ValueError, match="num_clients=0 must be >= 1"):
    PagedState(init, 0)


def _kill_and_resume(tmp_path, kill_round, where):
  full = driver.run(str(tmp_path / "full"))
  killed = subprocess.run([sys.executable, DRIVER, str(tmp_path / "run"), str(kill_round), where], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=300)
  assert killed.returncode == -9, killed.stderr[-3000:]
  resumed = subprocess.run([sys.executable, DRIVER, str(tmp_path / "run")], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  with np.load(tmp_path / "run" / "final.npz") as z:
    for k, v in full.items():
      assert z[k].dtype == v.dtype
      np.testing.assert_array_equal(z[k], v)


class Stopped(Exception):
  pass


@pytest.mark.parametrize("kill_round,where", [(5, "mid_scatter"), (4, "after_commit")])
def test_a_run_stopped_between_writes_resumes_bitwise_in_process(tmp_path, kill_round, where):
  """The SIGKILL tests' run, stopped in process at the same points (the paged state's writes are
  on disk when they return; its object and the checkpointer are dropped, as a kill drops them),
  then resumed by a new run on the same directories."""
  full = driver.run(str(tmp_path / "full"))

  def die():
    raise Stopped

  with pytest.raises(Stopped):
    driver.run(str(tmp_path / "run"), kill_round, where, die=die)
  resumed = driver.run(str(tmp_path / "run"))
  for k, v in full.items():
    np.testing.assert_array_equal(resumed[k], v)


@pytest.mark.slow
@pytest.mark.parametrize("kill_round,where", [(5, "mid_scatter"), (3, "after_scatter"), (4, "after_commit"),
                                              (4, "mid_scatter")])
def test_sigkill_anywhere_resumes_bitwise(tmp_path, kill_round, where):
  _kill_and_resume(tmp_path, kill_round, where)
