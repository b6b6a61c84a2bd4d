"""fedtree.evaluation.plots: every picture from a workdir, the benchmark files, and no
matplotlib import until a picture is drawn."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from fedtree.evaluation import plots  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
  with open(path, "rb") as f:
    return f.read(8) == PNG


def _workdir(tmp_path):
  lines = []
  for run in ("fedavg", "cfl"):
    for r in (5, 10, 15):
      rec = {"run": run, "round": r, "train_loss": 1.0 / r, "global/accuracy": 0.4 + r / 100}
      if run == "cfl":
        rec.update({"cluster/accuracy": 0.5 + r / 100, "cluster/intra_cluster_accuracy": 0.6,
                    "cluster/inter_cluster_accuracy": 0.2 + r / 100,
                    "global/false_accept_rate": 0.02, "global/false_reject_rate": 0.1})
      lines.append(json.dumps(rec))
  lines.append(json.dumps({"run": "fedavg", "round": 15, "train_loss": 0.0, "global/accuracy": 0.9}))
  lines.append('{"run": "fedavg", "rou')  # a line cut short by a killed run
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  summary = {"fedavg": {"global": {"accuracy": 0.5, "client_accuracy": [0.5, 0.6, None]}},
             "cfl": {"global": {"client_accuracy": [0.5, 0.6, 0.7]},
                     "cluster": {"client_accuracy": [0.5, 0.6, 0.7]}}}
  (tmp_path / "summary.json").write_text(json.dumps(summary))
  return str(tmp_path)


def test_read_metrics_keeps_the_last_report_of_a_round(tmp_path):
  records = plots.read_metrics(_workdir(tmp_path))
  assert plots.runs(records) == ["fedavg", "cfl"]
  rounds, acc = plots.curve(records, "fedavg", "global/accuracy")
  np.testing.assert_array_equal(rounds, [5, 10, 15])
  np.testing.assert_allclose(acc, [0.45, 0.5, 0.9])
  assert plots.models_of(records) == ["global", "cluster"]


def test_every_experiment_of_a_sweep_is_its_own_curve(tmp_path):
  # A sweep writes a row per experiment and round under one run label (a chunked one under
  # '<run>#chunk<k>'): each (setting, seed) is a curve of its own, not the last experiment's.
  lines = [{"run": "fedavg", "round": 2, "global/accuracy": 0.5}]
  for x, (mu, seed) in enumerate([(0.1, 0), (0.1, 1), (1.0, 0), (1.0, 1)]):
    for r in (1, 2):
      lines.append({"run": f"fedprox#chunk{x // 2}", "round": r, "experiment": x, "seed": seed,
                    "setting": {"runs.fedprox.mu": mu}, "global/accuracy": x + r / 10,
                    "uplink_MB": r * 0.5})
  (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
  records = plots.read_metrics(str(tmp_path))
  assert plots.runs(records) == ["fedavg", "fedprox [mu=0.1] seed 0", "fedprox [mu=0.1] seed 1",
                                 "fedprox [mu=1] seed 0", "fedprox [mu=1] seed 1"]
  np.testing.assert_allclose(plots.curve(records, "fedprox [mu=1] seed 0", "global/accuracy")[1],
                             [2.1, 2.2])
  one_seed = [r for r in lines if r.get("seed", 0) == 0]
  (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, one_seed)) + "\n")
  assert plots.runs(plots.read_metrics(str(tmp_path))) == ["fedavg", "fedprox [mu=0.1]", "fedprox [mu=1]"]
  seeds_only = [{**r, "setting": {}} if "setting" in r else r for r in lines if r.get("experiment", 0) < 2]
  (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, seeds_only)) + "\n")
  assert plots.runs(plots.read_metrics(str(tmp_path))) == ["fedavg", "fedprox seed 0", "fedprox seed 1"]
  written = sorted(os.path.basename(p) for p in plots.write_run_plots(str(tmp_path)))
  assert written == ["plot_accuracy.png", "plot_accuracy_uplink.png"]


def test_fairness_over_rounds_from_the_rows(tmp_path, monkeypatch):
  # rows with the spread of per-client accuracy (the runner's <model>/<metric>_<stat>) give
  # plot_fairness_rounds.png; a run whose model never trained is left out of it
  lines = []
  for run in ("fedavg", "hier"):
    for r in (1, 2, 3):
      rec = {"run": run, "round": r, "global/accuracy": 0.5 + r / 10 if run == "fedavg" else 0.1}
      rec.update({f"global/accuracy_{k}": v for k, v in
                  dict(p10=0.3, p50=0.5 + r / 10, p90=0.9, worst10_mean=0.2 + r / 20).items()})
      lines.append(json.dumps(rec))
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  (tmp_path / "summary.json").write_text(json.dumps({"hier": {"global": {"trained": False}}}))
  records = plots.read_metrics(str(tmp_path))
  assert plots.fairness_keys(records) == [("global", "accuracy")]
  written = [os.path.basename(p) for p in plots.write_run_plots(str(tmp_path))]
  assert "plot_fairness_rounds.png" in written
  fig_lines = []
  real_save = plots._save

  def grab(fig, path):
    fig_lines.extend(line.get_label() for ax in fig.axes for line in ax.lines)
    return real_save(fig, path)

  monkeypatch.setattr(plots, "_save", grab)
  plots.plot_fairness_over_rounds(records, str(tmp_path / "f.png"), skip={"hier"})
  assert fig_lines == ["fedavg: median client", "fedavg: worst 10 %"]
  assert _is_png(tmp_path / "f.png")


def test_write_run_plots_writes_every_picture_the_metrics_allow(tmp_path):
  written = plots.write_run_plots(_workdir(tmp_path))
  names = sorted(os.path.basename(p) for p in written)
  assert names == ["plot_accuracy.png", "plot_client_accuracy.png", "plot_clusters.png",
                   "plot_keyword_rates.png", "plot_models.png"]
  assert all(_is_png(p) for p in written)


def test_client_accuracies_drop_duplicate_models():
  summary = json.loads(json.dumps({"r": {"global": {"client_accuracy": [0.1, 0.2]},
                                         "level1": {"client_accuracy": [0.1, 0.2]},
                                         "personal": {"client_accuracy": [0.3, None]}}}))
  out = plots.client_accuracies(summary)
  assert list(out) == ["r · global", "r · personal"]
  assert np.isnan(out["r · personal"][1])


def test_models_that_never_changed_are_left_out_of_the_histograms():
  records = [{"run": "edges", "round": r, "global/accuracy": 0.05, "level1/accuracy": 0.5 + r / 10}
             for r in (1, 2, 3)]
  assert plots.frozen_models(records) == {("edges", "global")}
  summary = {"edges": {"global": {"client_accuracy": [0.0, 0.1]}, "level1": {"client_accuracy": [0.7, 0.9]}}}
  assert list(plots.client_accuracies(summary, skip=plots.frozen_models(records))) == ["edges · level1"]


def test_distribution_pictures(tmp_path):
  rng = np.random.default_rng(0)
  base = rng.uniform(2, 5, 50)
  paths = [
    plots.plot_relative_change(base, base * rng.uniform(0.8, 1.1, 50), str(tmp_path / "fig1.png")),
    plots.plot_client_histograms({"a": base, "b": base + 1}, str(tmp_path / "h.png")),
    plots.plot_group_bars({"a": [0.1, 0.2], "b": [0.3, 0.4]}, str(tmp_path / "g.png")),
    plots.plot_cluster_tradeoff({"β=0": (0.9, 0.1), "β=1": (0.4, 0.6)}, str(tmp_path / "t.png")),
  ]
  assert all(_is_png(p) for p in paths)


@pytest.mark.parametrize("name", ["all.json", "scaling.json"])
def test_benchmark_results_draw(tmp_path, name):
  path = plots.plot_benchmark_file(os.path.join(ROOT, "benchmarks", "results", name), str(tmp_path / "b.png"))
  assert _is_png(path)


def test_importing_plots_imports_no_matplotlib():
  code = "import sys, fedtree.evaluation.plots, fedtree.evaluation; print('matplotlib' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}, check=True)
  assert out.stdout.strip() == "False"


@pytest.mark.slow  # the quickstart's four runs in a subprocess: ~45 s on 2 shared cores
def test_quickstart_cli_writes_the_pictures(tmp_path):
  cmd = [sys.executable, "-m", "fedtree.main", "--config=configs/quickstart.py", f"--workdir={tmp_path}",
         "--config.rounds=2", "--config.eval_every=1", "--config.rounds_per_call=1",
         "--config.progress=False", "--config.data.group_sizes=(3,2)",
         "--config.runs.fedavg.cohort_size=3", "--config.runs.fedadam.cohort_size=3",
         "--config.runs.hierfavg.cohort_size=2", "--config.runs.edges_only.cohort_size=2"]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"plots: {tmp_path / 'plot_accuracy.png'}" in out.stderr
  for name in ("plot_accuracy.png", "plot_models.png", "plot_client_accuracy.png"):
    assert _is_png(str(tmp_path / name)), name


def test_a_language_model_run_gets_a_perplexity_picture(tmp_path):
  """An LM run's records (``<model>/perplexity`` and ``<model>/sentence_perplexity``) give
  ``plot_perplexity.png`` beside the accuracy picture; a run without perplexity gets none."""
  lines = [json.dumps({"run": "grouppfl", "round": r, "train_loss": 5.0 / r, "FL/accuracy": 0.1 * r,
                       "FL/loss": 5.0 / r, "FL/perplexity": 150.0 / r, "FL/sentence_perplexity": 170.0 / r,
                       "GroupFL/accuracy": 0.1 * r, "GroupFL/perplexity": 120.0 / r})
           for r in (1, 2, 3)]
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  written = [os.path.basename(p) for p in plots.write_run_plots(str(tmp_path))]
  assert "plot_perplexity.png" in written and "plot_accuracy.png" in written
  assert _is_png(tmp_path / "plot_perplexity.png")
  (tmp_path / "plain").mkdir()
  assert "plot_perplexity.png" not in [os.path.basename(p) for p in
                                       plots.write_run_plots(_workdir(tmp_path / "plain"))]


def _figures(monkeypatch):
  """Every figure a plot function draws, kept open instead of saved."""
  figs = []
  monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or path)
  return figs


def test_a_run_has_one_colour_in_every_panel_and_every_figure_a_title(monkeypatch, tmp_path):
  figs = _figures(monkeypatch)
  records = plots.read_metrics(_workdir(tmp_path))
  plots.plot_runs(records, "a.png", models=["global", "cluster"])
  acc, loss = figs[0].axes
  colors = {ln.get_label(): ln.get_color() for ln in acc.lines}
  assert colors["fedavg · global"] != colors["cfl · global"] == colors["cfl · cluster"]
  assert {ln.get_label(): ln.get_color() for ln in loss.lines} == {
    "fedavg": colors["fedavg · global"], "cfl": colors["cfl · global"]}
  plots.plot_keyword_rates(records, "k.png")
  plots.plot_models_per_run(records, "m.png")
  plots.plot_client_histograms({"a": [0.1, 0.2]}, "h.png")
  assert all(f._suptitle is not None and f._suptitle.get_text() for f in figs)


def test_untrained_models_are_left_out_and_final_only_models_drawn(monkeypatch, tmp_path):
  """A model ``summary.json`` marks ``"trained": false`` is not drawn, a model that only stopped
  changing (FL after GroupPerFL's global stage) is, and a model evaluated only at the end
  (PerFL) is a final point."""
  figs = _figures(monkeypatch)
  rows = [{"run": "gp", "round": r, "train_loss": 1.0, "FL/accuracy": min(r, 2) / 10,
           "GroupFL/accuracy": r / 10} for r in (1, 2, 3, 4)]
  rows += [{"run": "edges", "round": r, "train_loss": 1.0, "global/accuracy": 0.05,
            "level1/accuracy": r / 10} for r in (1, 2)]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  summary = {"gp": {"FL": {"accuracy": 0.2, "trained": True}, "GroupFL": {"accuracy": 0.4, "trained": True},
                    "PerFL": {"accuracy": 0.3}},
             "edges": {"global": {"accuracy": 0.05, "trained": False}, "level1": {"accuracy": 0.2}}}
  (tmp_path / "summary.json").write_text(json.dumps(summary))
  plots.write_run_plots(str(tmp_path))
  labels = [ln.get_label() for ln in figs[0].axes[0].lines]
  assert labels == ["gp · FL", "gp · GroupFL", "edges · level1", "gp · PerFL (final)"]
  final = figs[0].axes[0].lines[-1]
  assert list(final.get_xdata()) == [4] and list(final.get_ydata()) == [0.3]


def test_client_histograms_are_a_panel_per_series_on_shared_axes(monkeypatch):
  figs = _figures(monkeypatch)
  rng = np.random.default_rng(0)
  plots.plot_client_histograms({k: rng.uniform(0, 1, 40) for k in "abcde"}, "h.png")
  axes = [ax for ax in figs[0].axes if ax.get_visible()]
  assert len(axes) == 5
  assert len({ax.get_xlim() for ax in axes}) == 1 and len({ax.get_ylim() for ax in axes}) == 1
  assert all("mean" in ax.get_title() for ax in axes)
