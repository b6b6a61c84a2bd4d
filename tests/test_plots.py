"""fedtree.experiment.plots: every picture from a workdir, the benchmark files, and no
matplotlib import until a picture is drawn."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from fedtree.experiment import plots  # noqa: E402

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
  real_save = plots.save

  def grab(fig, path):
    fig_lines.extend(line.get_label() for ax in fig.axes for line in ax.lines)
    return real_save(fig, path)

  monkeypatch.setattr(plots.figure, "save", grab)
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
  code = "import sys, fedtree.experiment.plots, fedtree.evaluation; print('matplotlib' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}, check=True)
  assert out.stdout.strip() == "False"


@pytest.mark.slow  # the quickstart's four runs in a subprocess: ~45 s on 2 shared cores
def test_quickstart_cli_writes_the_pictures(tmp_path):
  cmd = [sys.executable, "-m", "fedtree.main", "--config=configs/quickstart.py", f"--workdir={tmp_path}",
         "--config.rounds=2", "--config.eval_every=1", "--config.rounds_per_call=1",
         "--config.progress=False", "--config.data.group_sizes=(3,2)",
         "--config.runs.fedavg.cohort_size=3", "--config.runs.fedadam.cohort_size=3",
         "--config.runs.hierfavg.cohort_size=2", "--config.runs.edges_only.cohort_size=2",
         # the root aggregates within the 2 rounds: hierfavg has two trained models (plot_models.png)
         "--config.runs.hierfavg.periods=(2,)"]
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
  monkeypatch.setattr(plots.figure, "save", lambda fig, path: figs.append(fig) or path)
  return figs


def _figures_by_name(monkeypatch):
  """Every figure a plot function draws, by the name of its file (the first of a name), kept open
  instead of saved."""
  figs = {}

  def keep(fig, path):
    figs.setdefault(os.path.basename(path), fig)
    return path

  monkeypatch.setattr(plots.figure, "save", keep)
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


# ------------------------------------------------------------- issue 42: many runs, untrained models
def _robust_like(tmp_path, attacks=("none", "signflip", "alie", "labelflip", "backdoor"),
                 defences=("mean", "median", "trimmed", "mkrum", "rfa", "cclip", "fltrust")):
  """configs/robust.py's 63 run labels ({attack}_{defence}_{percent}, none_{defence}) with made-up rows."""
  rng = np.random.default_rng(0)
  labels = [f"{a}_{d}" if a == "none" else f"{a}_{d}_{f}" for a in attacks for f in (10, 30)
            for d in defences if a != "none" or f == 10]
  rows, summary = [], {}
  for run in labels:
    final = 0.6 + 0.35 * rng.random()
    for r in (20, 40):
      acc = final * r / 40
      rows.append({"run": run, "round": r, "train_loss": 1 / r, "global/accuracy": acc, "uplink_MB": r / 10,
                   **{f"global/accuracy_{k}": acc + d for k, d in
                      (("p10", -0.1), ("p50", 0.0), ("p90", 0.05), ("worst10_mean", -0.15))}})
    s = {"accuracy": final, "trained": True, "client_accuracy": list(final + 0.05 * rng.normal(size=10)),
         "fairness": {"metric": "accuracy", "clients": 10, "p10": final - 0.1, "p50": final,
                      "p90": final + 0.05, "worst10_mean": final - 0.15, "gini": 0.05}}
    if run.startswith("backdoor"):
      s["attack_success_rate"] = rng.random()
    summary[run] = {"global": s}
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  (tmp_path / "summary.json").write_text(json.dumps(summary))
  return labels


def _inside(fig) -> bool:
  """Every legend and axes title of ``fig`` lies within the figure once it is drawn."""
  fig.canvas.draw()
  box = fig.bbox
  artists = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
  artists += [ax.title for ax in fig.axes if ax.get_visible() and ax.get_title()]
  return all(box.x0 - 1 <= a.get_window_extent().x0 and a.get_window_extent().x1 <= box.x1 + 1
             and box.y0 - 1 <= a.get_window_extent().y0 and a.get_window_extent().y1 <= box.y1 + 1
             for a in artists)


ALL_ATTACKS = ("none", "signflip", "alie", "labelflip", "backdoor")
ALL_DEFENCES = ("mean", "median", "trimmed", "mkrum", "rfa", "cclip", "fltrust")


@pytest.mark.parametrize("attacks,defences", [
  (("none", "signflip", "backdoor"), ("mean", "median", "mkrum")),   # 15 runs, ~5 s
  pytest.param(ALL_ATTACKS, ALL_DEFENCES, marks=pytest.mark.slow),   # the 63 runs, ~15 s
])
def test_many_runs_are_drawn_a_panel_per_family_with_the_legend_outside(monkeypatch, tmp_path, attacks,
                                                                        defences):
  """configs/robust.py's runs (63, issue 42 item 3): curves a panel per attack with one legend
  beside the panels, the final results as an attack x defence heatmap, per-client spreads a row
  per run; no legend leaves its figure and matplotlib warns about no layout."""
  import warnings

  labels = _robust_like(tmp_path, attacks, defences)
  assert len(labels) == len(defences) * (2 * len(attacks) - 1)
  figs = _figures_by_name(monkeypatch)
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # "Tight layout not applied", "legend ... too large", ...
    written = [os.path.basename(p) for p in plots.write_run_plots(str(tmp_path))]
    assert all(_inside(fig) for fig in figs.values()), [n for n, f in figs.items() if not _inside(f)]
  assert {"plot_accuracy.png", "plot_fairness_rounds.png", "plot_final_table.png",
          "plot_client_accuracy.png", "plot_client_fairness.png"} <= set(written)
  acc = figs["plot_accuracy.png"]
  panels = [ax for ax in acc.axes if ax.get_visible()]
  assert sorted({ax.get_title().split(":")[0] for ax in panels}) == sorted(attacks)
  assert len(panels) == 2 * len(attacks) and sum(len(ax.lines) for ax in panels) == 2 * len(labels)
  # one legend: a colour per defence, then a line style per suffix (10, 30, none)
  assert len(acc.legends) == 1 and len(acc.legends[0].get_texts()) == len(defences) + 3
  table = figs["plot_final_table.png"]
  accuracy, asr = [ax for ax in table.axes if ax.get_images()]
  assert [t.get_text() for t in accuracy.get_xticklabels()] == list(defences)
  assert len(accuracy.get_yticklabels()) == 2 * len(attacks) - 1
  assert [t.get_text() for t in asr.get_yticklabels()] == ["backdoor_10", "backdoor_30"]
  assert len(figs["plot_client_accuracy.png"].axes[0].get_yticklabels()) == len(labels)


def test_a_grid_and_facets_only_where_the_labels_make_one():
  assert plots.facets(["fedavg", "fedadam", "hierfavg"]) is None   # few runs: one panel
  assert plots.facets([f"run{i}" for i in range(20)]) is None        # no families
  assert plots.grid_of(["fedavg", "fedadam", "hierfavg", "edges_only"]) is None
  assert plots.grid_of([f"lr{a}_mu{b}" for a in (1, 2, 3) for b in (1, 2)]) == (
    1, ["lr1", "lr2", "lr3"], ["mu1", "mu2"])


def test_a_sweep_over_seeds_is_a_line_per_setting_and_its_untrained_model_is_not_drawn(monkeypatch, tmp_path):
  """configs/quickstart.py:seeds (issue 42 items 3 and 4): 4 runs x 8 seeds are 4 mean curves with a
  ±std band, not 32 legend entries; the root of edges_only, which never aggregates, is left out
  (its sweep's summary lists it untrained)."""
  rows = []
  for run in ("fedavg", "edges_only"):
    for seed in range(8):
      for r in (10, 20):
        row = {"run": run, "round": r, "setting": {}, "seed": seed, "experiment": seed,
               "train_loss": 1 / r + seed / 100, "uplink_MB": r / 10,
               "global/accuracy": 0.1 if run == "edges_only" else r / 40 + seed / 100}
        if run == "edges_only":
          row["level1/accuracy"] = r / 30
        rows.append(row)
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  summary = {run: {"sweep": {"select": "global/accuracy", "best": None, "settings": [],
                             "untrained": ["global"] if run == "edges_only" else []}}
             for run in ("fedavg", "edges_only")}
  (tmp_path / "summary.json").write_text(json.dumps(summary))
  figs = _figures_by_name(monkeypatch)
  plots.write_run_plots(str(tmp_path))
  acc = figs["plot_accuracy.png"].axes[0]
  assert [ln.get_label() for ln in acc.lines] == ["fedavg (mean of 8 seeds) · global",
                                                  "edges_only (mean of 8 seeds) · level1"]
  np.testing.assert_allclose(acc.lines[0].get_ydata(), [0.25 + 0.035, 0.5 + 0.035])
  assert acc.collections   # the ±std band over seeds
  uplink = figs["plot_accuracy_uplink.png"].axes[0]
  assert [ln.get_label() for ln in uplink.lines] == ["fedavg (mean of 8 seeds)"]


def test_untrained_models_are_left_out_of_the_models_and_uplink_pictures(monkeypatch, tmp_path):
  """Issue 42 item 4: plot_models.png and plot_accuracy_uplink.png drew models that never trained."""
  rows = [{"run": run, "round": r, "train_loss": 1.0, "uplink_MB": r / 10,
           "global/accuracy": 0.05 if run == "edges" else r / 10, "level1/accuracy": r / 8}
          for run in ("hier", "edges") for r in (1, 2)]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  summary = {"hier": {"global": {"trained": True}, "level1": {"trained": True}},
             "edges": {"global": {"trained": False}, "level1": {"trained": True}}}
  (tmp_path / "summary.json").write_text(json.dumps(summary))
  figs = _figures_by_name(monkeypatch)
  plots.write_run_plots(str(tmp_path))
  models = {ax.get_title(): [ln.get_label() for ln in ax.lines] for ax in figs["plot_models.png"].axes}
  assert models == {"hier": ["global", "level1"], "edges": ["level1"]}
  assert "never trained, left out: edges global" in figs["plot_models.png"]._suptitle.get_text()
  assert [ln.get_label() for ln in figs["plot_accuracy_uplink.png"].axes[0].lines] == ["hier"]
