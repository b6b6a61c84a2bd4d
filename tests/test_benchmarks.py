"""Smoke test of the benchmark scripts at tiny sizes, in-process (no timing is asserted)."""

import glob
import json
import os

import numpy as np
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
  for name in ("fedtree", "central"):   # how far from the hardware (benchmarks.hardware)
    assert by[name]["round_flops"] > 0 and by[name]["flops_fraction"] > 0 and by[name]["bytes_fraction"] > 0
  assert "flops_fraction" not in by["torch"]
  saved = json.load(open(tmp_path / "smoke.json"))
  assert "fedtree/this" in saved["table"] and len(saved["results"]) == 3
  assert saved["peaks"]["flops_per_s"] > 0 and "% peak FLOP/s" in saved["table"]
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


def test_secure_benchmark_reports_overheads_against_the_plain_round(tmp_path):
  """SecAgg's round against the plain one, measured in the same run (no timing asserted); the
  distributed DP round in the slow sibling."""
  from benchmarks import secure

  out = tmp_path / "secure.json"
  res = secure.main(["--clients=4", "--rounds=1", "--repeats=1", "--paths=secagg", f"--out={out}"])
  rounds = res["rounds"]
  assert set(rounds) == {"plain", "secagg"} and rounds["plain"]["overhead"] == 0
  assert all(r["s_per_round"] > 0 and r["cpu_s_per_round"] >= 0 for r in rounds.values())
  assert json.load(open(out))["rounds"]["secagg"]["overhead"] == rounds["secagg"]["overhead"]


@pytest.mark.slow
def test_secure_benchmark_times_the_distributed_dp_round(tmp_path):
  from benchmarks import secure

  res = secure.main(["--clients=4", "--rounds=1", "--repeats=1", f"--out={tmp_path / 'secure.json'}"])
  assert set(res["rounds"]) == {"plain", "secagg", "ddg"} and res["rounds"]["ddg"]["s_per_round"] > 0


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


def test_memory_report_sets_the_estimated_peak_beside_the_measured_one():
  """The memory sweep (issue 58): per population, the process's peak as its memory line states it, the
  child's measured ru_maxrss, and their ratio (tests/test_memory_peak.py runs the children)."""
  from benchmarks import scaling

  rows = [dict(clients=10_000, layout="padded", eval_chunk="None", estimate=694 * 2**20, peak=647 * 2**20),
          dict(clients=10_000, layout="streamed", eval_chunk="None", estimate=600 * 2**20, peak=700 * 2**20,
               peak_own=500 * 2**20)]
  table = scaling.memory_table(rows).splitlines()
  assert table[2].split() == ["10,000", "padded", "None", "694", "647", "1.073", "-", "-"]
  assert table[3].split() == ["10,000", "streamed", "None", "600", "700", "0.857", "500", "1.200"]


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


# ------------------------------------------------------------------------ issue 41's GPU session
def _torch_layout_cnn(w: dict, x: np.ndarray) -> np.ndarray:
  """pfl-research's ``simple_cnn`` written out in numpy in PyTorch's layout (NCHW, ``[out, in, kh,
  kw]`` kernels, flatten by channel, row, column), evaluation mode: the reference for ``to_flax``."""
  def conv(x, k, b):                           # valid 3x3 cross-correlation, x [n, c, h, w]
    n, c, h, wd = x.shape
    out = np.zeros((n, k.shape[0], h - 2, wd - 2))
    for i in range(3):
      for j in range(3):
        out += np.einsum("nchw,oc->nohw", x[:, :, i:i + h - 2, j:j + wd - 2], k[:, :, i, j])
    return out + b[None, :, None, None]

  h = np.maximum(conv(np.moveaxis(x, -1, 1), w["conv0.weight"], w["conv0.bias"]), 0)
  h = np.maximum(conv(h, w["conv1.weight"], w["conv1.bias"]), 0)
  n, c, hh, ww = h.shape
  h = h[:, :, : hh // 2 * 2, : ww // 2 * 2].reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
  h = np.maximum(h.reshape(n, -1) @ w["dense0.weight"].T + w["dense0.bias"], 0)
  return h @ w["dense1.weight"].T + w["dense1.bias"]


def test_pfl_initial_weights_give_fedtree_the_same_model():
  """The shared initialization of the pfl-research comparison: fedtree's ``cnn`` with
  ``to_flax(weights)`` computes the logits of pfl-research's PyTorch-layout CNN with ``weights``."""
  import jax.numpy as jnp

  from benchmarks.pfl_cifar10 import initial_weights, to_flax
  from fedtree.models import build_model

  image = (8, 8, 3)
  w = initial_weights(3, image)
  assert w["conv0.weight"].shape == (32, 3, 3, 3) and w["dense0.weight"].shape == (128, 64 * 2 * 2)
  bound = np.sqrt(6.0 / (128 + 256))                  # Xavier-uniform, as pfl-research initializes
  assert np.abs(w["dense0.weight"]).max() <= bound and np.abs(w["dense0.weight"]).max() > 0.9 * bound
  x = np.random.default_rng(0).standard_normal((3,) + image).astype(np.float32)
  model = build_model("cnn", example_shape=image, num_classes=10)
  got = model.apply(to_flax(w), jnp.asarray(x), train=False)
  np.testing.assert_allclose(np.asarray(got), _torch_layout_cnn(w, x), rtol=1e-4, atol=1e-4)


def test_pfl_benchmark_data_are_written_once_and_read_back(tmp_path):
  from benchmarks.pfl_cifar10 import load_data, workload, write_data

  write_data(str(tmp_path), users=3, per_user=10, test=7, seed=1)
  meta, arr, init = load_data(str(tmp_path))
  assert arr["x_train"].shape == (30, 32, 32, 3) and arr["y_test"].shape == (7,)
  assert arr["x_train"].dtype == np.float32 and set(np.unique(arr["y_train"])) <= set(range(10))
  np.testing.assert_allclose(arr["x_train"].mean(axis=(0, 1, 2)), 0, atol=1e-4)    # standardized
  assert set(init) == {f"{n}.{p}" for n in ("conv0", "conv1", "dense0", "dense1") for p in ("weight", "bias")}
  w = workload(meta, cohort=2)
  assert (w.num_clients, w.examples, w.cohort, w.local_steps, w.batch_size) == (3, 10, 2, 1, 10)


HLO = """HloModule m

%fused_update (param_0: f32[4,60,200], param_1: f32[4,60,200]) -> f32[4,60,200] {
  %param_0 = f32[4,60,200]{2,1,0} parameter(0)
  %param_1 = f32[4,60,200]{2,1,0} parameter(1)
  ROOT %subtract.1 = f32[4,60,200]{2,1,0} subtract(%param_0, %param_1)
}

%step (arg: (f32[4,60,200], f32[4,16,60], f32[4,16,200])) -> (f32[4,60,200], f32[4,16,60], f32[4,16,200]) {
  %arg = (f32[4,60,200]{2,1,0}, f32[4,16,60]{2,1,0}, f32[4,16,200]{2,1,0}) parameter(0)
  %w = f32[4,60,200]{2,1,0} get-tuple-element(%arg), index=0
  %x = f32[4,16,60]{2,1,0} get-tuple-element(%arg), index=1
  %dy = f32[4,16,200]{2,1,0} get-tuple-element(%arg), index=2
  %y = f32[4,16,200]{2,1,0} dot(%x, %w), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}
  %g = f32[4,60,200]{2,1,0} dot(%x, %dy), lhs_batch_dims={0}, lhs_contracting_dims={1}, rhs_batch_dims={0}
  %new = f32[4,60,200]{2,1,0} fusion(%w, %g), kind=kLoop, calls=%fused_update
  %copy.3 = f32[4,60,200]{2,1,0} copy(%new)
  ROOT %t = (f32[4,60,200]{2,1,0}, f32[4,16,60]{2,1,0}, f32[4,16,200]{2,1,0}) tuple(%copy.3, %x, %y)
}

%done (arg.1: (f32[4,60,200], f32[4,16,60], f32[4,16,200])) -> pred[] {
  %arg.1 = (f32[4,60,200]{2,1,0}, f32[4,16,60]{2,1,0}, f32[4,16,200]{2,1,0}) parameter(0)
  ROOT %c = pred[] constant(false)
}

ENTRY %main (p0: f32[4,60,200], p1: f32[4,16,60], p2: f32[4,16,200]) -> f32[4,60,200] {
  %p0 = f32[4,60,200]{2,1,0} parameter(0)
  %p1 = f32[4,16,60]{2,1,0} parameter(1)
  %p2 = f32[4,16,200]{2,1,0} parameter(2)
  %init = (f32[4,60,200]{2,1,0}, f32[4,16,60]{2,1,0}, f32[4,16,200]{2,1,0}) tuple(%p0, %p1, %p2)
  %loop = (f32[4,60,200], f32[4,16,60], f32[4,16,200]) while(%init), condition=%done, body=%step
  ROOT %out = f32[4,60,200]{2,1,0} get-tuple-element(%loop), index=0
}
"""


def test_param_traffic_lists_the_passes_over_parameter_sized_buffers():
  """A hand-written step loop: the forward dot reads the [4, 60, 200] kernel, the gradient dot
  writes one, the fused update reads two and writes one, the carry's copy reads and writes one;
  the fusion's body, the loop's own bookkeeping and the entry's tuples are no passes."""
  from benchmarks import param_traffic as pt

  comps = pt.parse_hlo(HLO)
  assert set(comps) == {"fused_update", "step", "done", "main"}
  assert pt.fused(comps) == {"fused_update"} and pt.loop_bodies(comps) == {"step": "loop"}
  sizes = pt.param_sizes([12000, 200], chunk=4)
  assert sizes == {48000, 800, 48800}
  rows = {r["name"]: r for r in pt.passes(comps, sizes)}
  assert set(rows) == {"y", "g", "new", "copy.3"}
  assert [(rows[n]["reads"], rows[n]["writes"]) for n in ("y", "g", "new", "copy.3")] == [
    (1, 0), (0, 1), (2, 1), (1, 1)]
  assert rows["new"]["read_bytes"] == 2 * 48000 * 4 and rows["new"]["kind"] == "kLoop"
  assert all(r["computation"] == "step" and r["loop"] == "loop" for r in rows.values())


NESTED = """HloModule nested

%inner_done (a: (f32[4,60,200])) -> pred[] {
  %a = (f32[4,60,200]{2,1,0}) parameter(0)
  ROOT %t = pred[] constant(true)
}

%inner_step (b: (f32[4,60,200])) -> (f32[4,60,200]) {
  %b = (f32[4,60,200]{2,1,0}) parameter(0)
  %w = f32[4,60,200]{2,1,0} get-tuple-element(%b), index=0
  %w2 = f32[4,60,200]{2,1,0} copy(%w)
  ROOT %r = (f32[4,60,200]{2,1,0}) tuple(%w2)
}

%outer_done (c: (f32[4,60,200])) -> pred[] {
  %c = (f32[4,60,200]{2,1,0}) parameter(0)
  ROOT %u = pred[] constant(true)
}

%outer_chunk (d: (f32[4,60,200])) -> (f32[4,60,200]) {
  %d = (f32[4,60,200]{2,1,0}) parameter(0)
  %x = f32[4,60,200]{2,1,0} get-tuple-element(%d), index=0
  %bcast = f32[4,60,200]{2,1,0} copy(%x)
  %x2 = f32[4,60,200]{2,1,0} copy(%bcast)
  %x3 = f32[4,60,200]{2,1,0} add(%x2, %bcast)
  %init = (f32[4,60,200]{2,1,0}) tuple(%x3)
  %steps = (f32[4,60,200]{2,1,0}) while(%init), condition=%inner_done, body=%inner_step
  ROOT %o = (f32[4,60,200]{2,1,0}) tuple(%x3)
}

ENTRY %main (p: f32[4,60,200]) -> (f32[4,60,200]) {
  %p = f32[4,60,200]{2,1,0} parameter(0)
  %i = (f32[4,60,200]{2,1,0}) tuple(%p)
  ROOT %chunks = (f32[4,60,200]{2,1,0}) while(%i), condition=%outer_done, body=%outer_chunk
}
"""


def test_param_traffic_takes_the_innermost_loop_as_the_local_step():
  """On the H100 (issue 41) the chunk loop's body (broadcast, finiteness check, aggregation) moved more
  parameter-sized bytes than the local step's loop nested in it, and was reported as the step: the
  step is the innermost loop that moves any."""
  from benchmarks import param_traffic as pt

  comps = pt.parse_hlo(NESTED)
  assert pt.loop_depths(comps) == {"outer_chunk": 1, "inner_step": 2}
  rows = pt.passes(comps, pt.param_sizes([12000], chunk=4))
  moved = {c: sum(r["read_bytes"] + r["write_bytes"] for r in rows if r["computation"] == c)
           for c in ("outer_chunk", "inner_step")}
  assert moved["outer_chunk"] > moved["inner_step"] > 0     # the heuristic it replaces picked the chunk
  assert pt.local_step(comps, rows) == "inner_step"


def test_param_traffic_profiles_and_analyses_a_round(tmp_path):
  from benchmarks import param_traffic

  res = param_traffic.main(["--clients=8", "--rounds=1", "--calls=1", "--chunk-size=4",
                            f"--out-dir={tmp_path}"])
  s = res["summary"]
  assert s["step_computation"] is not None and s["passes_reading"] >= 1 and s["passes_writing"] >= 1
  assert s["times_the_floor"] >= 1.0                    # at least one read and one write per step
  assert res["meta"]["param_bytes_per_client"] == 4 * 54410
  assert os.path.exists(tmp_path / "param_traffic" / "analysis.json")
  assert glob.glob(str(tmp_path / "param_traffic" / "**" / "*.xplane.pb"), recursive=True)


@pytest.mark.slow
def test_methods_benchmark_times_the_capabilities_against_fedavg(tmp_path):
  """Issue 41's rows of ``benchmarks.methods``: FedAvg with a personal head, DP, the median, QSGD;
  never in the default run."""
  from benchmarks import methods

  assert not set(methods.CAPABILITIES) & set(methods.METHODS)
  rows = methods.main(["--clients=8", "--methods=personal_head,dp,median,qsgd8", "--rounds=1",
                       "--repeats=1", "--tag=c", f"--out-dir={tmp_path}"])
  assert [r["method"] for r in rows] == ["fedavg", "personal_head", "dp", "median", "qsgd8"]
  assert all(r["cpu_s_per_round"] > 0 and r["clients_per_round"] == 8 for r in rows)
  assert "personal_head" in json.load(open(tmp_path / "c.json"))["table"]


@pytest.mark.slow
def test_methods_benchmark_times_every_composition_beside_its_plain_round(tmp_path):
  """Issue 55's COMPOSED rows of ``benchmarks.methods``: each runs, and each composition's row has its
  ratio to its plain method's round (the name before ``_``)."""
  from benchmarks import methods

  names = list(methods.COMPOSED)
  plain = sorted({n.split("_")[0] for n in names} - set(names))
  rows = methods.main(["--clients=8", f"--methods=fedavg,{','.join(plain + names)}", "--rounds=1",
                       "--repeats=1", "--tag=k", f"--out-dir={tmp_path}"])
  by = {r["method"]: r for r in rows}
  assert set(names) <= set(by)
  assert all(by[n]["cpu_vs_plain"] > 0 for n in names if "_" in n)


@pytest.mark.slow
def test_pfl_benchmark_runs_both_frameworks_on_the_same_data(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("pfl")
  from benchmarks import pfl_cifar10

  rows = pfl_cifar10.main(["--users=8", "--cohort=2", "--test=20", "--iterations=20", "--procs=1",
                           "--seeds=0", "--timeout=600", f"--out-dir={tmp_path}"])
  assert [r["label"] for r in rows] == ["pfl, 1 proc", "fedtree"]
  for r in rows:
    assert "skipped" not in r, r["skipped"]
    assert r["iterations"] == 20 and r["steady_s"] > 0 and np.isfinite(r["train_loss"])


def test_llm_benchmark_model_flops_and_the_fedtree_worker(tmp_path):
  """``benchmarks.llm``: the model-FLOPs count of its docstring on a hand-checked shape, and one fedtree
  worker round of its toy model in-process (no checkpoint: fedtree draws the shape)."""
  from benchmarks import llm

  a = llm.parse(["--tiny"])
  hd = 64 // 4
  matrices = 2 * (64 * (4 * hd + 2 * 2 * hd) + 4 * hd * 64 + 3 * 64 * 128) + 64 * 512
  adapters = 2 * 8 * ((64 + 64) + (64 + 32))
  assert llm.model_flops_per_token(a) == 4 * matrices + 8 * 2 * 64 * 64 + 6 * adapters
  assert llm.model_params(a) == 2 * (64 * 128 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * 512 * 64 + 64
  a.k, a.repeats = 2, 1
  r = llm.run_fedtree(a)
  assert r["round_s"] > 0 and r["compiled_MB"] > 0 and np.isfinite(r["loss"])


@pytest.mark.slow
def test_llm_benchmark_runs_both_sides_on_one_checkpoint(tmp_path):
  """``python -m benchmarks.llm --tiny``: fedtree and transformers + peft, each K in its own process."""
  pytest.importorskip("peft")
  from benchmarks import llm

  out = llm.main(["--tiny", "--clients=2", f"--out_dir={tmp_path}"])
  assert {r["framework"] for r in out["rows"]} == {"fedtree", "torch"}
  assert all(r["tokens_per_s"] > 0 and r["peak_rss_MB"] > 0 for r in out["rows"])
  assert "| 2 |" in llm.table(out)


@pytest.mark.slow
def test_population_benchmark_runs_tiny(tmp_path):
  """benchmarks/population.py cannot rot: --what=fits and --what=million at --tiny sizes, one run each,
  print their ratios, and the streamed run's model is the resident one's, bitwise."""
  from benchmarks import population

  common = ["--tiny", "--rounds=5", "--repeats=1", f"--store-dir={tmp_path}"]
  fits = population.fits(population._args(["--what=fits", *common]))
  assert fits["same_model"] and fits["throughput_ratio"] > 0
  million = population.million(population._args(["--what=million", *common]))
  assert million["seconds_ratio"] > 0 and million["big"]["clients"] == 20_000


def test_stop_poll_benchmark_runs_tiny():
  """benchmarks/stop_poll.py cannot rot: the plain and the stoppable program timed side by side."""
  from benchmarks import stop_poll

  rows = stop_poll.main(["--tiny"])
  assert len(rows) == 1 and rows[0]["ratio"] > 0 and rows[0]["poll_every"] == 1


@pytest.mark.slow   # two rounds of each side on 10 clients (the default run has HeteroFL's own tests)
def test_masked_against_sliced_benchmark_reaches_equal_results():
  """benchmarks/heterogeneous.py cannot rot: the masked tier and the per-client loop of sliced sub-models
  end the timed rounds at the same global model (float32 rounding apart)."""
  from benchmarks import heterogeneous

  out = heterogeneous.main(["--clients=10", "--rounds=1", "--repeats=1"])
  assert out["max_abs_diff"] < 1e-5 and out["masked_s"] > 0 and out["loop_s"] > 0


def test_hardware_costs_a_client_step_from_its_loop_free_program():
  """benchmarks.hardware: XLA's cost analysis counts a loop's body once (why a round is costed from
  one client step, not from the fused program); a logistic regression's step costs its two
  products (forward ``2bdk``, the weights' gradient ``2bdk``) and little else; the peaks are positive
  and a fraction is the achieved rate over them."""
  import jax
  import jax.numpy as jnp
  import optax

  from benchmarks import hardware
  from fedtree.models import build_model

  a = jnp.ones((64, 64))
  scan = jax.jit(lambda x: jax.lax.scan(lambda c, _: (c @ a, None), x, None, length=10)[0])
  once = jax.jit(lambda x: x @ a)
  flops = [(f.lower(a).compile().cost_analysis() or {}) for f in (scan, once)]
  flops = [(c[0] if isinstance(c, list) else c)["flops"] for c in flops]
  assert flops[1] == 2 * 64 ** 3 and flops[0] < 1.01 * flops[1]   # ten products counted as one (and the
  # loop counter's increment)
  b, d, k = 16, 32, 10
  model = build_model("logreg", example_shape=(d,), num_classes=k)
  cost = hardware.client_step_cost(model, optax.sgd(0.1), (d,), b)
  assert 4 * b * d * k <= cost["flops"] <= 1.5 * 4 * b * d * k, cost
  assert cost["bytes"] >= 4 * (b * d + 2 * d * k)   # at least the batch and the weights read and written
  peak = hardware.peaks(sizes=(64,), copy_mib=4, calls=2)
  assert peak["flops_per_s"] > 0 and peak["bytes_per_s"] > 0 and peak["device"]
  got = hardware.fractions(cost, 10, 0.5, peak)
  assert np.isclose(got["flops_fraction"], cost["flops"] * 10 / 0.5 / peak["flops_per_s"])
  assert "GFLOP/s" in hardware.describe(peak)
