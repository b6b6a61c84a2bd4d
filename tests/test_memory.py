"""fedtree.experiment.memory: a run's (or a sweep chunk's) memory is stated and checked before
anything compiles, naming the largest chunk that fits."""

import jax
import pytest
from helpers import hierfavg_config

from fedtree import experiment
from fedtree.core import loop


def test_a_run_that_cannot_fit_fails_before_compiling_with_the_largest_chunk_that_fits(capsys):
  from fedtree.experiment import memory, runner

  c = hierfavg_config(rounds=2)
  c.checkpoint_every = 0
  c.runs.hierfavg.chunk_size = 6
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  budget = memory.Budget.of(ctx)
  state = memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
  step = budget.step_bytes()
  data = budget.data_bytes   # (issue 43: the clients' data on the device is part of the budget)
  assert state > 0 and step > 0 and data == memory.tree_bytes(ctx.data) > 0
  c.memory_limit_bytes = data + state + int(2.5 * step)  # the data, state and 2 clients' steps fit, not 6
  with pytest.raises(ValueError, match=rf"run 'hierfavg' does not fit in memory: state {state} bytes "
                                       rf"\+ chunk working set {6 * step} bytes \(chunk_size=6\).*"
                                       r"config.memory_limit_bytes\); set chunk_size <= 2"):
    experiment.train_and_evaluate(c, None)
  # a state that does not fit (the clients' data, counted since issue 43, does: twice on CPU, the
  # host arrays and their copy)
  c.model.hidden = (1024,)
  c.memory_limit_bytes = None
  ctx = runner.make_context(c)
  wide = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  big = memory.tree_bytes(jax.eval_shape(wide.init, loop.init_key(jax.random.key(0))))
  assert big > 8 * data
  c.memory_limit_bytes = 2 * data + big // 2
  with pytest.raises(ValueError, match="even the smallest chunk does not fit"):
    experiment.train_and_evaluate(c, None)
  line = memory.check_memory("x", state_bytes=state, step_bytes=step, chunk=2, limit=state + 3 * step,
                             source="test")
  assert line.startswith("x: memory estimate ") and "chunk working set 2 x" in line


def test_a_sweep_that_cannot_fit_names_the_experiments_per_chunk_that_fit():
  from fedtree.experiment import memory, runner

  c = hierfavg_config(rounds=2)
  c.checkpoint_every = 0
  c.runs.hierfavg.chunk_size = 3
  c.sweep.seeds = 4
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  budget = memory.Budget.of(ctx)
  one = (memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
         + 3 * budget.step_bytes())
  c.memory_limit_bytes = budget.data_bytes + int(2.5 * one)  # beside the shared data, 2 of 4 fit
  with pytest.raises(ValueError, match=r"\(chunk_size=3, 4 experiments at once\).*; set sweep.chunk <= 2"):
    experiment.train_and_evaluate(c, None)


def test_the_clients_data_is_counted_and_a_population_that_does_not_fit_is_refused(capsys):
  """Issue 43 item 3: the estimate left out the clients' data, which stays on the device, so
  it was the same for 1,000 and 300,000 clients and a population too large for memory was killed
  by the kernel. The data is now counted (it grows with the population); a population whose data
  cannot be copied to the device (on CPU: twice its bytes, the host arrays and the device's copy)
  is refused before the copy, and one whose data does not fit beside the state and one client's
  step before anything compiles, each with the numbers and about how many clients fit."""
  from fedtree.experiment import memory, runner

  sizes = {}
  for scale in (1, 4):
    c = hierfavg_config(rounds=1)
    c.data.group_sizes = tuple(scale * g for g in c.data.group_sizes)
    c.data.min_examples = c.data.max_examples = 20   # every client padded alike: bytes per client fixed
    sizes[scale] = memory.Budget.of(runner.make_context(c)).data_bytes
  assert sizes[4] == 4 * sizes[1]

  c = hierfavg_config(rounds=1)
  c.checkpoint_every = 0
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  budget = memory.Budget.of(ctx)
  shapes = jax.eval_shape(alg.init, loop.init_key(jax.random.key(0)))
  state = memory.tree_bytes(shapes)
  data, clients, step = budget.data_bytes, ctx.data.num_clients, budget.step_bytes()
  per = data / clients
  assert f"clients data {memory._gib(data)} ({clients} clients) + state" in budget.check("h", shapes, 2)
  budget.source = "a test's limit"   # not the memory available: the process's peak is not refused
  budget.limit = state + step + int(3.5 * per)   # the state, one step and 3 clients' data fit
  with pytest.raises(ValueError, match=(
      rf"run 'h' does not fit in memory: .* \+ clients data {data} bytes \({clients} clients\) = "
      rf".* even the smallest chunk does not fit: the clients' data alone is {data} bytes \({clients} "
      rf"clients x {per:.0f} bytes, kept on the device for the run\), and about 3 clients fit")):
    budget.check("h", shapes, 2)

  # evaluating every client at once (config.eval_chunk_size=None) does not fit, one client's step does:
  # the check chooses a chunk that fits (issue 58 item 2); a chunk the config gives is refused
  evaluation = budget.eval_bytes()
  assert evaluation > step
  budget.limit = data + state + (step + evaluation) // 2
  room = budget.limit - data - state
  fits = int(room // (evaluation / clients))
  line = budget.check("h", shapes, 1)
  assert 1 <= budget.chosen_eval_chunk == budget.eval_chunk <= fits
  assert line.endswith(f"does not fit: {budget.eval_chunk} clients at a time (config.eval_chunk_size chosen)")
  assert budget.eval_bytes() <= room
  budget.eval_chunk, budget.chosen_eval_chunk, budget._eval_bytes = clients, None, None
  with pytest.raises(ValueError, match=(
      rf"run 'h' does not fit in memory when it evaluates: state {state} bytes \+ evaluation working set "
      rf"{evaluation} bytes \(config.eval_chunk_size={clients}: {clients} clients at once\) .*; set "
      rf"config.eval_chunk_size <= {fits}")):
    budget.check("h", shapes, 1)

  c.memory_limit_bytes = int(2 * 5.5 * per)   # on CPU the host arrays and their copy: 5 clients fit
  with pytest.raises(ValueError, match=(
      rf"the clients' data does not fit in memory: {data} bytes \({clients} clients x {per:.0f} bytes\) "
      rf"held twice: .* {2 * data} bytes > limit {c.memory_limit_bytes} bytes \(config.memory_limit_bytes\); "
      rf"about 5 clients fit")):
    experiment.train_and_evaluate(c, None)
  assert "fedtree: workdir" not in capsys.readouterr().out   # refused before the run started


def _fake_files(monkeypatch, files):
  from fedtree.experiment import memory

  monkeypatch.setattr(memory, "_read", files.get)
  monkeypatch.setattr(memory.os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else 1000)


def test_the_default_limit_is_the_memory_available_to_the_process(monkeypatch):
  """Issue 58 item 4: the default limit on CPU was the host's physical memory, not what is free. It is
  now what the process holds (its RSS) plus the least of the machine's MemAvailable and what its cgroup
  (v2 memory.max, v1 memory.limit_in_bytes, less the usage that is not reclaimable file cache) has
  left, and the estimate's line names it."""
  from fedtree.experiment import memory

  rss = 100 * 4096
  base = {"/proc/self/statm": "500 100 20 1 0 80 0\n", "/proc/meminfo": "MemTotal: 64000000 kB\n"
          "MemFree: 1000 kB\nMemAvailable:    8388608 kB\n"}
  _fake_files(monkeypatch, base)   # no cgroup: MemAvailable (8 GiB) + the process's RSS
  assert memory.available_memory() == (8 * 2**30 + rss,
                                       f"available: MemAvailable 8 GiB + this process's {memory._gib(rss)}")
  v2 = {**base, "/proc/self/cgroup": "0::/job\n", "/sys/fs/cgroup/job/memory.max": "3221225472\n",
        "/sys/fs/cgroup/job/memory.current": str(2**30 + 2**28) + "\n",
        "/sys/fs/cgroup/job/memory.stat": f"anon 5\ninactive_file {2**28}\n"}
  _fake_files(monkeypatch, v2)   # 3 GiB, 1.25 GiB used of which 0.25 GiB reclaimable cache: 2 GiB left
  limit, source = memory.available_memory()
  assert limit == 2 * 2**30 + rss
  assert source.startswith("available: cgroup v2 memory.max 3 GiB less 1 GiB used")
  _fake_files(monkeypatch, {**v2, "/sys/fs/cgroup/job/memory.max": "max\n"})   # v2 without a limit
  assert memory.available_memory()[0] == 8 * 2**30 + rss
  v1 = {**base, "/proc/self/cgroup": "4:memory:/a/b\n1:cpu:/\n0::/\n",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": str(2**31),
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": str(2**30),
        "/sys/fs/cgroup/memory/memory.stat": "total_inactive_file 0\n"}
  _fake_files(monkeypatch, v1)   # v1, its files at the namespace's root (the process's folder absent)
  assert memory.available_memory() == (2**30 + rss, f"available: cgroup v1 memory.limit_in_bytes 2 GiB less "
                                                    f"1 GiB used + this process's {memory._gib(rss)}")
  _fake_files(monkeypatch, {**v1, "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"})
  assert memory.available_memory()[0] == 8 * 2**30 + rss   # v1's "no limit"
  _fake_files(monkeypatch, {})   # not Linux: the physical memory (4096 x 1000 pages here)
  assert memory.available_memory() == (4096 * 1000, "host physical memory")

  monkeypatch.setattr(memory.tuning, "device_memory_bytes", lambda: None)
  _fake_files(monkeypatch, v2)
  c = hierfavg_config(rounds=1)
  limit, source = memory.memory_limit(c)
  assert limit == 2 * 2**30 + rss and "cgroup v2 memory.max" in source
  line = memory.check_memory("x", state_bytes=10, step_bytes=10, chunk=1, limit=limit, source=source)
  assert line.endswith(f"limit {memory._gib(limit)} ({source})")


def test_a_run_whose_evaluation_of_every_client_does_not_fit_chooses_a_chunk_that_does(capsys):
  """Issue 58 item 2: a run accepted for its rounds used to fail at its first evaluation (every client
  at once, the default), with no hint that config.eval_chunk_size exists. The check now picks the
  largest evaluation chunk that fits beside the data and the state, says so in the run's memory line,
  and the run evaluates with it; the caller's config is left as it was."""
  from fedtree.experiment import memory, runner

  c = hierfavg_config(rounds=1)
  c.checkpoint_every = 0
  c.data.group_sizes, c.model.hidden = (40, 20, 20), (256,)   # an evaluation far larger than the data
  c.runs.hierfavg.chunk_size = 2
  ctx = runner.make_context(c)
  alg = experiment.registry.build_algorithm("hierfavg", c.runs.hierfavg, ctx)
  budget = memory.Budget.of(ctx)
  state = memory.tree_bytes(jax.eval_shape(alg.init, loop.init_key(jax.random.key(0))))
  every = budget.eval_bytes()
  twenty = memory.eval_bytes(ctx.model, ctx.data, 20)
  assert twenty < every / 3
  c.memory_limit_bytes = budget.data_bytes + state + twenty + 1000   # 20 clients' evaluation fits, all 80 not
  data, step = budget.data_bytes, budget.step_bytes()
  assert c.memory_limit_bytes > max(2 * data, data + state + 2 * step)   # the data's copy and a chunk fit
  planned, _ = runner._plan(["hierfavg"], ctx, jax.random.key(0), False)   # ctx.config is c
  run, note = planned["hierfavg"]
  chosen = run.context.config.eval_chunk_size
  assert 1 <= chosen <= 20 and note.endswith(
    f"evaluating every client at once ({memory._gib(every)}) does not fit: {chosen} clients at a time "
    f"(config.eval_chunk_size chosen)")
  results = experiment.train_and_evaluate(c, None)
  assert results["hierfavg"] and c.get("eval_chunk_size", None) is None
  printed = capsys.readouterr()
  assert f"{chosen} clients at a time (config.eval_chunk_size chosen)" in printed.out + printed.err


def test_a_generated_population_too_large_is_refused_before_it_is_generated(monkeypatch):
  """Issue 58 item 3: the data's size was checked only once the data were generated (35 s and a 3.1 GB
  peak before a clean refusal at 10^6 clients). Its size is now computed from the config's fields, a
  lower bound (the padded length the longest client reaches but with chance 1e-9), and a population
  that cannot fit is refused before any array is made."""
  import time

  import ml_collections

  from fedtree.experiment import data as data_mod
  from fedtree.experiment import memory, runner

  def made(cfg):
    return memory.tree_bytes(data_mod.load(ml_collections.ConfigDict(cfg))[0])

  for cfg in (dict(name="grouped_synthetic", group_sizes=(4, 2, 2), dim=8, max_examples=20, test_examples=8),
              dict(name="grouped_synthetic", group_sizes=(300, 200), dim=5, min_examples=2, max_examples=8,
                   mean_examples=4.0, test_examples=3),
              dict(name="grouped_synthetic", group_sizes=(50,), dim=5, layout="ragged"),
              dict(name="synthetic", num_clients=40, dim=6, max_examples=60),
              dict(name="synthetic", num_clients=30, dim=4, samples_scale=2)):
    planned = data_mod.planned_size(ml_collections.ConfigDict(cfg))
    actual = made(cfg)
    assert planned.bytes <= actual, (cfg, planned, actual)
    if cfg.get("max_examples") in (8, 60):   # enough clients that the longest reaches the cap: exact
      assert planned.bytes == actual, (cfg, planned, actual)
  assert data_mod.planned_size(ml_collections.ConfigDict(dict(name="sklearn_digits"))) is None

  c = hierfavg_config(rounds=1)   # the population: 10^6 clients of 2-8 examples
  c.data.group_sizes, c.data.min_examples, c.data.max_examples, c.data.mean_examples = (10**6,), 2, 8, 4.0
  c.data.dim, c.data.test_examples = 32, 4
  c.memory_limit_bytes = 2 * 2**30

  def never(**kwargs):
    raise AssertionError("generated")

  monkeypatch.setattr(data_mod, "grouped_synthetic", never)
  start = time.perf_counter()
  per = (8 + 4) * (32 * 4 + 4) + 8   # padded to 8 train and 4 test rows of 32 float32 and a label, 2 counts
  with pytest.raises(ValueError, match=(
      rf"the clients' data would not fit in memory \(refused before generating it\): at least {10**6 * per} "
      rf"bytes \(1000000 clients x \(8 train \+ 4 test examples x 132 bytes\)\) held twice: .* > limit "
      rf"{2 * 2**30} bytes \(config.memory_limit_bytes\); about {2**31 // (2 * per)} clients fit")):
    runner.make_context(c)
  assert time.perf_counter() - start < 5


def test_the_line_states_the_process_peak_and_the_available_memory_refuses_what_exceeds_it():
  """Issue 58 item 1: on CPU the line adds what the process holds at peak (its RSS now, the runtime
  reserve, the state and the larger working set), checked against the memory available (a config's
  own limit keeps bounding the run's arrays alone); where the evaluation makes the excess, a smaller
  evaluation chunk is named."""
  from fedtree.experiment import memory

  mib = 2**20
  kw = dict(state_bytes=mib, step_bytes=mib, chunk=2, data_bytes=10 * mib, clients=100,
            evaluation_bytes=50 * mib, process_bytes=300 * mib)
  peak = 300 * mib + memory.RUNTIME_RESERVE + mib + 50 * mib
  line = memory.check_memory("x", limit=peak, source="available: MemAvailable", **kw)
  assert f"this process at peak {memory._gib(peak)} (now 0.293 GiB" in line
  assert memory.check_memory("x", limit=peak - 1, source="config.memory_limit_bytes", **kw)
  with pytest.raises(memory.EvaluationDoesNotFit, match="does not fit in the memory available") as e:
    memory.check_memory("x", limit=peak - 25 * mib, source="available: MemAvailable", **kw)
  assert e.value.fits == 50   # half the evaluation's 50 MiB fits: 50 of its 100 clients
  with pytest.raises(ValueError, match="does not fit in the memory available"):
    memory.check_memory("x", limit=300 * mib + memory.RUNTIME_RESERVE, source="available: MemAvailable",
                        **{**kw, "evaluation_bytes": 0})   # the state and the chunk's 2 MiB do not fit
  # a model's own reserve (its step's program measured) replaces the default
  big = memory.runtime_reserve(1448)
  line = memory.check_memory("x", limit=None, source="", **kw, reserve=big)
  assert "no memory limit known" in line
  line = memory.check_memory("x", limit=10 * peak, source="available: MemAvailable", **kw, reserve=big)
  assert f"this process at peak {memory._gib(300 * mib + big + mib + 50 * mib)}" in line
  assert f"+ {memory._gib(big)} compiling and running" in line


def test_the_reserve_grows_with_the_models_program():
  """Issue 58: what compiling a run's rounds costs the process grows with the model's program: the
  reserve follows the lines of its optimized client step (an LSTM's three times the MLP's), and the
  budget measures them with the step's bytes in one compile."""
  import optax

  from fedtree.core import tuning
  from fedtree.experiment import memory
  from fedtree.models import build_model

  mlp = tuning.client_step_program(build_model("mlp", example_shape=(8,), num_classes=4, hidden=(16,)),
                                   optax.sgd(0.1), (8,), 4)
  lm = build_model("lstm_lm", example_shape=(6,), num_classes=50, embed=8, hidden=16, layers=2)
  lstm = tuning.client_step_program(lm, optax.sgd(0.1), (6,), 4)
  assert 0 < mlp.lines < lstm.lines and mlp.bytes > 0 and lstm.bytes > 0
  assert memory.runtime_reserve(mlp.lines) < memory.runtime_reserve(lstm.lines)
  assert memory.runtime_reserve(0) == memory.RUNTIME_RESERVE   # a step not measured: the default
  assert memory.runtime_reserve(484) <= memory.RUNTIME_RESERVE   # the quickstart's MLP's step


def test_tensorboard_is_written_without_importing_torch(tmp_path):
  """tensorboardX imports PyTorch where it is installed (to accept its tensors), which cost a run 1.5 s
  and 190 MiB resident before its first round; fedtree's writer leaves it out, and torch imports
  normally afterwards."""
  import subprocess
  import sys

  code = ("import sys\n"
          "from fedtree.experiment.reporting import _summary_writer\n"
          f"w = _summary_writer()({str(tmp_path)!r})\n"
          "w.add_scalar('a', 1.0, 0)\n"
          "w.close()\n"
          "assert 'torch' not in sys.modules\n"
          "import importlib.util\n"
          "if importlib.util.find_spec('torch'):\n"
          "  import torch\n")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
  assert any(p.name.startswith("events.out.tfevents") for p in tmp_path.iterdir())


@pytest.mark.parametrize("name,what", [("scaffold", "the clients' variate changes Δc_i"),
                                       ("mimelite", "the clients' gradients ∇f_i\\(x\\)")])
def test_the_messages_a_robust_aggregator_holds_are_in_the_estimate(name, what):
  """Issue 55: SCAFFOLD's variates and MimeLite's gradients go through the robust rule's blocks beside
  the updates (a model's worth a slot): named in the estimate under a blockwise aggregator, absent
  under the mean."""
  import ml_collections
  from test_sweep import tiny

  from fedtree.experiment import memory, registry, runner

  c = tiny(runs=("fedavg",), rounds=1)
  c.runs = ml_collections.ConfigDict({"m": {"algorithm": name, "cohort_size": 4,
                                            "aggregator": {"name": "median"}}})
  c.run_order = ("m",)
  ctx = runner.make_context(c)
  rctx = registry.run_context(ctx, "m", c.runs.m)
  paths = registry.capability_arguments("m", c.runs.m, rctx).get("update_paths")
  needs = registry.memory_needs("m", c.runs.m, ctx, paths)
  one = memory.tree_bytes(jax.eval_shape(ctx.model.init, jax.random.key(0)))
  (label, held), = needs.cohort
  assert label.startswith(what.replace("\\", "")) and held == memory.block_bytes(one, 4, 4, pairwise=False)
  assert not registry.memory_needs("m", c.runs.m, ctx, None).cohort
