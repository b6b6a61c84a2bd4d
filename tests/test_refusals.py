"""Refusals (issue 27 items 3 and 6, issue 28 items 7 and 8): every bad value is one line naming
the field, the value and what is allowed, found before the first run trains or anything is
written (a value in the last run, or in one setting of a sweep, included), so the corrected
command is not refused as "a different config". Most cases call ``train_and_evaluate`` in
process (it stops before compiling); the command line's own refusals run ``fedtree.main``."""

import os
import subprocess
import sys

import ml_collections
import pytest
from config_files import load_config

from fedtree import experiment
from fedtree.experiment import runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
CD = ml_collections.ConfigDict


def tiny():
  """The quickstart's four runs on 5 clients, one round."""
  c = load_config("quickstart")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = 1, 1, 1, False, False
  c.data.group_sizes, c.data.dim, c.data.max_examples, c.data.test_examples = (3, 2), 6, 16, 4
  c.model.hidden = (4,)
  for run in c.runs.values():
    run.cohort_size = 2
  return c


def _set(**fields):
  def mutate(c):
    for path, value in fields.items():
      *parents, name = path.split("__")
      node = c
      for p in parents:
        node = node[p]
      with node.ignore_type():
        node[name] = value
  return mutate


def _add_run(label, **run):
  def mutate(c):
    c.runs[label] = CD(run)
  return mutate


def _per_client_steps_bhfl(c):
  with c.local.ignore_type():
    c.local.steps = (2, 2, 2, 2, 2)
  c.runs.bhfl = CD(dict(algorithm="bhfl", eta_down=0.5, proxy_examples=4, proxy_levels=(0,)))


def _swept_bad_setting(c):
  c.sweep.params = "runs.fedadam.server.learning_rate=0.01,-1"
  c.only = "fedadam"


CASES = {
  "negative server rate": (_set(runs__fedadam__server__learning_rate=-1.0),
                           r"config.runs.fedadam \(algorithm='fedopt'\): server learning_rate=-1.0 "
                           r"\(server 'fedadam'\) must be > 0 and finite"),
  "nan local rate": (_set(local__learning_rate=float("nan")),
                     r"config.local.learning_rate=nan must be a finite number"),
  "inf server rate": (_set(runs__fedadam__server__learning_rate=float("inf")),
                      r"config.runs.fedadam.server.learning_rate=inf must be a finite number"),
  "zero dim": (_set(data__dim=0), r"config.data.dim=0 must be an int >= 1"),
  "zero hidden": (_set(model__hidden=(0,)), r"config.model.hidden=\(0,\) must be every entry an int >= 1"),
  "zero classes": (_set(data__num_classes=0), r"config.data.num_classes=0 must be an int >= 1"),
  "negative data seed": (_set(data__seed=-1), r"config.data.seed=-1 must be an int >= 0"),
  "sizes without sizes": (_set(topology__kind="sizes"),
                          r"config.topology.kind='sizes' needs config.topology.sizes"),
  "bad value in the last run": (_set(runs__edges_only__periods=(0,)),
                                r"config.runs.edges_only \(algorithm='hierfavg'\): periods\[0\]=0 "
                                r"must be >= 1"),
  "grouppfl cohort list": (_add_run("gp", algorithm="grouppfl", global_rounds=1, group_rounds=1,
                                    cohort_size=[2, 2]),
                           r"config.runs.gp \(algorithm='grouppfl'\): cohort_size=\(2, 2\) must be "
                           r"one int >= 1 for every group"),
  "bhfl proxy per-client steps": (_per_client_steps_bhfl,
                                  r"config.runs.bhfl \(algorithm='bhfl'\): proxy_steps is needed: "
                                  r"config.local.steps gives per-client step counts \(5 of them\)"),
  "bad sweep setting": (_swept_bad_setting, r"learning_rate=-1.0 .*must be > 0 and finite"),
  "bad divergence bound": (_set(divergence_bound=0.0), r"config.divergence_bound=0.0 must be a finite"),
  "bad dtype": (_set(dtype="float16"), r"config.dtype='float16'; choose one of"),
  "unknown only": (_set(only="fedavg,nope"), r"config.only='fedavg,nope' names \['nope'\]"),
  "bad run order": (_set(run_order=("nope",)), r"config.run_order names \['nope'\]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_value_is_one_line_and_nothing_is_written(tmp_path, case):
  mutate, message = CASES[case]
  c = tiny()
  mutate(c)
  with pytest.raises(ValueError, match=message) as e:
    experiment.train_and_evaluate(c, str(tmp_path / "w"))
  assert "\n" not in str(e.value)
  assert not (tmp_path / "w").exists() or not os.listdir(tmp_path / "w"), os.listdir(tmp_path / "w")


def test_a_different_config_is_refused_naming_the_run_and_field(tmp_path):
  c = runner.prepare_config(tiny())
  runner.write_workdir(str(tmp_path), c, overwrite=False)
  c.runs.hierfavg.periods = (3,)
  with pytest.raises(ValueError, match=(r"holds a run of a different config \(run 'hierfavg': "
                                        r"config.runs.hierfavg.periods is \[10\] there, \[3\] here;")):
    runner.check_workdir(str(tmp_path), c, overwrite=False)
  c.runs.hierfavg.periods = (10,)
  c.rounds, c.only = 7, "fedavg"   # not results: the same run, extended or a subset
  runner.check_workdir(str(tmp_path), c, overwrite=False)


def _main(*args):
  return subprocess.run([sys.executable, "-m", "fedtree.main", *args], cwd=ROOT, env=ENV,
                        capture_output=True, text=True, timeout=300)


MAIN_CASES = [
  (["--config=configs/quickstart.py:bogus"],
   "Error whilst parsing config file: ValueError: configs/quickstart.py:bogus; choose no variant or 'seeds'"),
  (["--config=configs/quickstart.py", "--cpu_devices=-1"], "--cpu_devices=-1 must be >= 0"),
  (["--config=NONE_CONFIG"], "its get_config() returned None (a missing return statement?)"),
  (["--config=configs/quickstart.py", "--config.data.dimm=3"],
   "--config.data.dimm: config.data has no field 'dimm'. Did you mean \"dim\"?"),
  # a parameter of the run's algorithm that the file does not list is accepted (then dim=0 is refused)
  (["--config=configs/quickstart.py", "--config.runs.fedadam.server.initial_accumulator=0.0",
    "--config.runs.fedadam.server.b1=0.8", "--config.data.dim=0"], "config.data.dim=0 must be an int >= 1"),
  (["--config=configs/quickstart.py", "--config.runs.fedadam.server_lr=0.1"],
   "config.runs.fedadam (algorithm='fedopt'): unknown field 'server_lr' (did you mean 'server'?)"),
]
QUICK_MAIN = (4,)
"""The cases of the default run (a fresh process each, ~4 s): the others are slow."""


@pytest.mark.parametrize("args,message", [
  c if i in QUICK_MAIN else pytest.param(*c, marks=pytest.mark.slow) for i, c in enumerate(MAIN_CASES)])
def test_command_line_refusals_are_one_line(tmp_path, args, message):
  none = tmp_path / "none_config.py"
  none.write_text("def get_config():\n  return None\n")
  args = [a.replace("NONE_CONFIG", str(none)) for a in args]
  proc = _main(*args, f"--workdir={tmp_path / 'w'}")
  assert proc.returncode == 1, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("fedtree: error:")]
  assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 3, proc.stderr
  assert not (tmp_path / "w").exists() or not os.listdir(tmp_path / "w")


def test_a_workdir_of_the_same_config_before_the_runner_fields_were_declared_resumes(tmp_path):
  """A workdir whose config.json lacks the runner fields added since (their defaults here) and
  whose fingerprint therefore differs is the same config: accepted; a real change is not."""
  import json

  c = runner.prepare_config(tiny())
  old = json.loads(c.to_json_best_effort())
  for field in ("dtype", "compute_dtype", "init_params", "only", "divergence_bound"):
    old.pop(field)
  old["local"].pop("batch_order")
  old["local"]["epochs"] = 1
  (tmp_path / "config.json").write_text(json.dumps(old))
  (tmp_path / "fingerprint.json").write_text(json.dumps({"fingerprint": "0123456789abcdef"}))
  runner.check_workdir(str(tmp_path), c, overwrite=False)
  c.dtype = "float64"
  with pytest.raises(ValueError, match=r"config.dtype is '<absent>' there, 'float64' here"):
    runner.check_workdir(str(tmp_path), c, overwrite=False)


def _mkrum_f_too_large(c):
  c.runs.mkrum = CD(dict(algorithm="fedavg", aggregator=CD(dict(name="multi_krum", f=3))))


def _swept_topk_fraction(c):
  c.runs.top = CD(dict(algorithm="fedavg", compression=CD(dict(uplink=CD(dict(name="topk", fraction=0.1))))))
  c.sweep.params = "runs.top.compression.uplink.fraction=0.1,0.5"
  c.only = "top"


def _pretrain_without_text(c):
  c.pretrain = CD(dict(packages=("json",), steps=2))


def _sweep_memory(c):
  c.sweep.seeds = 2
  c.only = "fedavg"
  c.memory_limit_bytes = 12000   # the clients' data fits (5680 bytes), two experiments' working set does not


def _sweep_of_stages(c):
  c.runs.gp = CD(dict(algorithm="grouppfl", global_rounds=1, group_rounds=1))
  c.sweep.params = "local.learning_rate=0.1,0.2"
  c.only = "gp"


LATE_CASES = {
  # refused while a round was traced, once config.json and fingerprint.json had been written
  "multi-krum f above the cohort": (_mkrum_f_too_large, r"krum: f=3 needs at least 9 updates per parent"),
  "swept top-k fraction": (_swept_topk_fraction,
                           r"fraction of 'topk' changes the shape .* cannot be a sweep axis"),
  # refused by the pretraining step, the sweep's memory check and the sweep runner, after the write
  "pretrain without text": (_pretrain_without_text, r"config.pretrain needs a text dataset"),
  "sweep over memory": (_sweep_memory, r"run 'fedavg' does not fit in memory: .*2 experiments at once"),
  "sweep of stages": (_sweep_of_stages, r"fixed-length composition of stages"),
}


def _snapshot(path) -> dict[str, bytes]:
  """Every file under ``path`` with its bytes (folders as ``b"<dir>"``)."""
  out = {}
  for root, dirs, files in os.walk(path):
    for d in dirs:
      out[os.path.relpath(os.path.join(root, d), path)] = b"<dir>"
    for f in files:
      with open(os.path.join(root, f), "rb") as fh:
        out[os.path.relpath(os.path.join(root, f), path)] = fh.read()
  return out


@pytest.mark.parametrize("case", sorted(LATE_CASES))
def test_a_refused_run_leaves_the_workdir_as_it_was(tmp_path, case):
  """Issue 42 item 2: the refusals that came after ``config.json`` / ``fingerprint.json`` were
  written now come before: a fresh workdir is not created, and a workdir holding a finished run
  is left byte for byte as it was, even with ``overwrite`` (which would have deleted its results)."""
  mutate, message = LATE_CASES[case]
  c = tiny()
  mutate(c)
  with pytest.raises(ValueError, match=message) as e:
    experiment.train_and_evaluate(c, str(tmp_path / "fresh"))
  assert "\n" not in str(e.value)
  assert not (tmp_path / "fresh").exists()
  done = tmp_path / "done"   # a finished run of another config
  done.mkdir()
  for name, text in (("config.json", "{}"), ("fingerprint.json", '{"fingerprint": "0123456789abcdef"}'),
                     ("metrics.jsonl", '{"run": "fedavg", "round": 1}\n'), ("summary.json", "{}")):
    (done / name).write_text(text)
  (done / "checkpoints" / "fedavg").mkdir(parents=True)
  before = _snapshot(done)
  with pytest.raises(ValueError, match=message):
    experiment.train_and_evaluate(c, str(done), overwrite=True)
  assert _snapshot(done) == before


@pytest.mark.parametrize("field,value,message", [
  ("optimizer", "adamx", r"config.pretrain: .*'adamx'"),
  ("packages", ("json", "no_such_package"), r"config.pretrain.packages: package 'no_such_package' is not"),
])
def test_a_refused_pretraining_leaves_the_workdir_as_it_was(tmp_path, field, value, message):
  """configs/peft_lm.py's pretraining read its packages and built its optimizer after the workdir
  was written (issue 42 item 2)."""
  c = load_config("peft_lm")
  c.data.packages, c.data.max_sentences = ("json", "email"), 8
  c.only = "lora"
  with c.pretrain.ignore_type():
    c.pretrain[field] = value
  with pytest.raises(ValueError, match=message):
    experiment.train_and_evaluate(c, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()
