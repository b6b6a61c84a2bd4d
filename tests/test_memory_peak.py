"""Issue 58 item 1: the memory a run says its process holds at peak is what it holds. A child process runs
the quickstart's FedAvg over a grid of populations, layouts and evaluation settings, and other models
(AFO's StackOverflow LSTM, whose compile costs the process twice the MLP's); its peak resident set
(``ru_maxrss``) must lie under the estimate's "this process at peak" figure, and the figure within 1.3x
of it. The child is :func:`benchmarks.scaling.memory_peak` (the memory sweep's); a streamed run reads the
same population from a store the test writes first."""

import pytest

from benchmarks.scaling import memory_peak


@pytest.mark.slow
@pytest.mark.parametrize("clients,layout,eval_chunk", [
  (1_000, "padded", None),       # the runtime dominates
  (30_000, "padded", None),      # the evaluation of every client at once dominates
  (30_000, "ragged", 1_000),     # the data and the runtime, evaluated in chunks
])
def test_the_estimated_peak_holds_within_1_3x(clients, layout, eval_chunk):
  m = memory_peak(clients, layout, eval_chunk, timeout=600)
  assert m["peak"] <= m["estimate"] <= 1.3 * m["peak"], m


@pytest.mark.slow
@pytest.mark.parametrize("clients", [1_000, 30_000])
def test_a_streamed_runs_estimated_peak_holds_within_1_3x(clients, tmp_path):
  """Against the process's resident set less the store's pages it has mapped (the page cache's, shared
  and reclaimed when memory is short; benchmarks/README.md)."""
  m = memory_peak(clients, timeout=600, store=str(tmp_path / "store"))
  assert m["layout"] == "streamed"
  assert m["peak_own"] <= m["estimate"] <= 1.3 * m["peak_own"], m


@pytest.mark.slow
@pytest.mark.parametrize("config", ["benchmarks/afo_stackoverflow:offline,quick"])
def test_another_models_estimated_peak_holds_within_1_3x(config):
  """The reserve for compiling and running follows the model's program (an LSTM's step is three times
  the MLP's): it was a constant measured on the MLP, and this run's line said 1.63 GiB against 1.90."""
  m = memory_peak(0, timeout=900, config=config)
  assert m["layout"] == config
  assert m["peak"] <= m["estimate"] <= 1.3 * m["peak"], m
