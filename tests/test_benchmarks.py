"""Smoke test of the benchmark scripts at tiny sizes, in-process (no timing is asserted)."""

import json
import os

import pytest


def test_throughput_smallest_setting_runs(tmp_path):
  pytest.importorskip("torch")
  from benchmarks import throughput

  results = throughput.main(["--workload=a", "--clients=8", "--frameworks=fedtree,central,torch",
                             "--in-process", "--rounds=1", "--repeats=1", "--tag=smoke",
                             f"--out-dir={tmp_path}"])
  by = {r["label"]: r for r in results}
  assert set(by) == {"fedtree", "central", "torch"}
  for r in results:
    assert "skipped" not in r, r.get("traceback", r.get("skipped"))
    assert r["client_updates_per_s"] > 0 and r["peak_rss_mb"] > 0
  saved = json.load(open(tmp_path / "smoke.json"))
  assert "fedtree/this" in saved["table"] and len(saved["results"]) == 3
  assert os.path.getsize(tmp_path / "smoke.png") > 0


def test_tree_and_scale_modes_run(tmp_path):
  from benchmarks import throughput

  res = throughput.main(["--workload=c", "--clients=20", "--in-process", "--rounds=1",
                         "--repeats=1", "--tag=c", f"--out-dir={tmp_path}"])
  assert [r["variant"] for r in res] == ["flat", "3-tier"] and all("skipped" not in r for r in res)
  res = throughput.main(["--workload=scale", "--clients=16", "--cohort=8", "--in-process",
                         "--rounds=1", "--tag=s", f"--out-dir={tmp_path}"])
  assert "skipped" not in res[0], res[0].get("traceback")
  assert res[0]["client_state_mb"] > 0       # the persistent per-client heads exist


def test_flower_job_skips_with_a_reason_when_too_large():
  from benchmarks import throughput, workloads

  jobs = throughput.jobs_for(workloads.mlp(50), ["flower"], flower_max_clients=10)
  assert "--flower-max-clients=10" in dict(jobs[0].options)["skip"]


def test_depth_sweep_trees_hold_every_client():
  from benchmarks.jax_runners import tree_topology

  for depth, nodes in [(1, [1, 1000]), (2, [1, 10, 1000]), (3, [1, 10, 20, 1000]),
                       (4, [1, 10, 20, 40, 1000])]:
    t = tree_topology(1000, depth)
    assert [t.num_nodes(lv) for lv in range(t.depth + 1)] == nodes


@pytest.mark.slow
def test_sweep_benchmark_scales_a_timed_subset_of_sequential_runs(tmp_path):
  from benchmarks import sweep

  out = tmp_path / "sweep.json"
  res = sweep.main(["--n=2", "--rounds=1", "--clients=4", "--workloads=a", "--sequential_max=1",
                    f"--out={out}"])
  (row,) = res["a"]
  assert (row["n"], row["sequential_timed"]) == (2, 1)
  assert row["sequential_s"] > 0 and row["sweep_s"] > 0 and row["ratio"] > 0
  assert json.load(open(out))["results"]["a"][0]["sequential_timed"] == 1
  assert os.path.getsize(tmp_path / "sweep.png") > 0


@pytest.mark.slow
def test_peft_benchmark_smallest_setting_runs(tmp_path):
  """``benchmarks.peft --quick`` with one mode: the memory of every client count from the
  compiled round, the throughput where it runs, the fit to the budget, the closure check."""
  from benchmarks import peft

  res = peft.main(["--quick", "--modes=lora", f"--out={tmp_path / 'peft.json'}"])
  rows = res["rows"]
  assert [r["clients"] for r in rows] == [4, 8] and all(r["client_updates_per_s"] > 0 for r in rows)
  assert rows[1]["state_bytes"] > rows[0]["state_bytes"] and res["fits"]["lora"]["max_clients"] > 8
  assert set(res["closure"]) == {"closed_over", "in_state"}


def test_privacy_benchmark_runs(tmp_path):
  from benchmarks import privacy

  out = tmp_path / "privacy.json"
  res = privacy.main(["--clients=4", "--rounds=1", "--repeats=1", "--sweep_rounds=1", "--settings=2",
                      f"--out={out}"])
  assert res["overhead"]["plain_s_per_round"] > 0 and res["overhead"]["dp_s_per_round"] > 0
  assert res["sweep"]["settings"] == 2 and res["sweep"]["ratio"] > 0
  assert json.load(open(out))["sweep"]["rounds"] == 1


def test_population_report_prints_ratios_against_the_smallest_population_and_the_shuffle():
  """The population row (issue 43 item 4): its table holds, per population, the round's time and
  its ratio to the smallest population's, and the cohort draw against the shuffle's, both
  measured in the same run (no timing is asserted)."""
  from benchmarks import scaling

  assert all(scaling.time_draw(200, 5, m, repeats=2) > 0 for m in ("auto", "shuffle"))
  rows = [dict(population=1000, seconds_per_round=0.01, draw_s=5e-4, shuffle_draw_s=5e-4),
          dict(population=300_000, seconds_per_round=0.012, draw_s=3e-4, shuffle_draw_s=1.2)]
  for r in rows:
    r.update(round_vs_smallest=r["seconds_per_round"] / 0.01,
             shuffle_vs_draw=r["shuffle_draw_s"] / r["draw_s"])
  table = scaling.population_table(rows).splitlines()
  assert table[0].split() == ["population", "ms/round", "x", "smallest", "draw", "ms", "shuffle", "ms",
                              "shuffle/draw"]
  assert table[3].split() == ["300,000", "12.00", "1.20x", "0.300", "1200.000", "4000.0x"]


@pytest.mark.slow
def test_population_sweep_runs(tmp_path):
  from benchmarks import scaling

  out = scaling.main(["--sweeps=population", "--populations=40,80", "--population-cohort=4", "--tag=p",
                      f"--out-dir={tmp_path}"])
  rows = out["population_sweep"]
  assert [r["population"] for r in rows] == [40, 80] and rows[0]["round_vs_smallest"] == 1.0
  assert all(r["shuffle_vs_draw"] > 0 for r in rows) and os.path.getsize(tmp_path / "p.png") > 0


def test_methods_benchmark_reports_ratios_to_fedavg(tmp_path):
  from benchmarks import methods

  rows = methods.main(["--clients=4", "--methods=fednova", "--rounds=1", "--repeats=1", "--tag=m",
                       f"--out-dir={tmp_path}"])
  assert [r["method"] for r in rows] == ["fedavg", "fednova"]   # FedAvg, the base, always measured
  assert rows[0]["cpu_vs_fedavg"] == 1.0 and rows[1]["client_updates_per_cpu_s"] > 0
  assert "x FedAvg" in json.load(open(tmp_path / "m.json"))["table"]
  with pytest.raises(SystemExit, match="unknown"):
    methods.main(["--methods=fedsgd"])
