"""Per-client distributions and fairness: the statistics against numpy on known per-client
accuracies, per group, in summarize's output, the final table and the histogram."""

import math

import numpy as np
import pytest

from fedtree.core.metrics import EvalStats, client_distribution, summarize
from fedtree.experiment.reporting import fairness_cell, format_summary


def reference(v, higher_is_better=True):
  """The statistics written out from their definitions."""
  v = np.asarray(v, float)
  v = v[~np.isnan(v)]
  k = math.ceil(len(v) / 10)
  worst = np.sort(v)[:k] if higher_is_better else np.sort(v)[::-1][:k]
  pairs = sum(abs(a - b) for a in v for b in v)
  return {"p10": np.percentile(v, 10), "p50": np.median(v), "p90": np.percentile(v, 90),
          "worst10_mean": worst.mean(), "std": np.std(v), "gini": pairs / (2 * len(v) ** 2 * v.mean())}


@pytest.mark.parametrize("n", [1, 7, 10, 23, 200])
def test_statistics_equal_numpy_on_known_accuracies(n):
  acc = np.random.default_rng(n).beta(4, 2, n)
  got = client_distribution(acc)
  assert got["metric"] == "accuracy" and got["clients"] == n
  for k, v in reference(acc).items():
    assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k


def test_hand_computed_values():
  # 10 clients: the worst 10 % is one client; sum_ij |i - j| / 10 = 2 * sum_d d (10 - d) / 10 = 33
  acc = np.arange(10) / 10.0
  d = client_distribution(acc)
  assert d["worst10_mean"] == 0.0 and d["p50"] == pytest.approx(0.45)
  assert d["p10"] == pytest.approx(0.09) and d["p90"] == pytest.approx(0.81)
  assert d["gini"] == pytest.approx(33.0 / (2 * 100 * 0.45))
  assert client_distribution(np.full(5, 0.8))["gini"] == 0.0          # all alike
  assert client_distribution(np.zeros(4))["gini"] == 0.0
  one_has_all = client_distribution([0, 0, 0, 1.0])                    # (n - 1) / n
  assert one_has_all["gini"] == pytest.approx(0.75)


def test_perplexity_worst_is_the_highest_and_nans_are_skipped():
  ppl = np.array([10.0, np.nan, 30.0, 20.0, 200.0, 15.0, 12.0, 11.0, 13.0, 14.0, 16.0, np.nan])
  d = client_distribution(ppl, metric="perplexity", higher_is_better=False)
  assert d["clients"] == 10 and d["worst10_mean"] == 200.0
  for k, v in reference(ppl, higher_is_better=False).items():
    assert d[k] == pytest.approx(v), k
  empty = client_distribution([np.nan, np.nan])
  assert empty["clients"] == 0 and np.isnan(empty["gini"])
  with pytest.raises(ValueError, match=r"value -0.5 < 0"):
    client_distribution([0.2, -0.5])


def test_summarize_gives_overall_and_per_group_fairness():
  correct = np.array([1.0, 4.0, 3.0, 0.0, 9.0, 5.0, 0.0])
  count = np.array([2.0, 4.0, 6.0, 5.0, 10.0, 5.0, 0.0])           # the last client has no test data
  groups = np.array([0, 0, 0, 1, 1, 1, 1])
  s = summarize(EvalStats(np.ones(7), correct, count), groups)
  acc = np.array([0.5, 1.0, 0.5, 0.0, 0.9, 1.0])
  for k, v in reference(acc).items():
    assert s["fairness"][k] == pytest.approx(v), k
  assert s["fairness"]["clients"] == 6
  for g, members in enumerate((acc[:3], acc[3:])):
    for k, v in reference(members).items():
      assert s["group_fairness"][g][k] == pytest.approx(v), (g, k)


def test_language_models_spread_perplexity():
  loss, count = np.array([2.0, 6.0, 3.0]), np.array([2.0, 3.0, 1.0])
  s = summarize(EvalStats(loss, np.zeros(3), count), perplexity=True)
  assert s["fairness"]["metric"] == "perplexity"
  assert s["fairness"]["worst10_mean"] == pytest.approx(np.exp(3.0))
  assert fairness_cell(s["fairness"]).count("/") == 2


def test_final_table_has_a_compact_fairness_column():
  s = summarize(EvalStats(np.ones(4), np.array([1.0, 2.0, 3.0, 4.0]), np.full(4, 4.0)))
  text = format_summary({"fedavg": {"global": s}})
  header, _, row = text.strip().splitlines()[1:4]
  assert "clients p10/p50/p90 gini" in header
  d = s["fairness"]
  assert f"{d['p10']:.2f}/{d['p50']:.2f}/{d['p90']:.2f} {d['gini']:.3f}" in row
  assert fairness_cell({"metric": "accuracy", "p10": float("nan")}) == "-"


def test_histogram_png(tmp_path):
  pytest.importorskip("matplotlib")
  from fedtree.experiment.plots import plot_client_fairness

  s = summarize(EvalStats(np.ones(4), np.array([1.0, 2.0, 3.0, 4.0]), np.full(4, 4.0)))
  model = {"fairness": s["fairness"], "client_accuracy": s["client_accuracy"].tolist()}
  summary = {"fedavg": {"global": model}}
  path = plot_client_fairness(summary, str(tmp_path / "f.png"))
  assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(ValueError, match="no model with a 'fairness' entry"):
    plot_client_fairness({"fedavg": {"global": {"accuracy": 0.5}}}, str(tmp_path / "g.png"))
