r"""Launch an experiment from a config file.

  python -m fedtree.main --config=configs/quickstart.py --workdir=/tmp/quickstart
  python -m fedtree.main --config=configs/quickstart.py --config.rounds=5 --workdir=/tmp/q

Every config field can be overridden with ``--config.<field>=<value>`` (ml_collections), and a
run the config file does not have is added by its fields
(``--config.runs.permfl.algorithm=pfedmt --config.runs.permfl.lam=15``).
Results (the final table, reports) go to stdout; progress and messages to stderr; metrics to
``<workdir>/metrics.jsonl`` and a final summary to ``<workdir>/summary.json``. Without
``--workdir`` nothing is saved (a warning says so). Re-running the same command resumes from
the workdir's checkpoints; a workdir of a different config is refused (``--overwrite`` starts
fresh). A refused input prints one line (``--verbose``: the traceback too). SIGINT/SIGTERM
stop after the round in progress (inside a call of fused rounds; over several processes after the
current call), checkpointing the state reached (when the config
checkpoints: ``--config.checkpoint_every``) and saying what a re-run resumes from; a second
signal aborts at once (one line; the rounds since the last checkpoint are lost).

On a multi-core CPU, ``--cpu_devices=N`` (e.g. the number of cores) splits the host into N
XLA devices and shards the clients over them: ~1.7x the throughput of one device on 2 cores
(benchmarks/README.md).
"""

from __future__ import annotations

import os
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

# New fields are accepted by ml_collections so that any parameter of a run's algorithm can be set
# (--config.runs.fedadam.server.initial_accumulator=0.0) although the config file does not list
# it; a new field anywhere else is refused by parse_flags (check_new_fields).
_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=False,
                                          accept_new_attributes=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics and summaries.")
_CPU_DEVICES = flags.DEFINE_integer(
  "cpu_devices", 0, "On CPU: split the host into this many XLA devices and shard the clients "
  "over them (sets XLA_FLAGS before JAX starts, and config.mesh_shape). 0: leave as is."
)
_MULTIHOST = flags.DEFINE_bool(
  "multihost", False, "Call jax.distributed.initialize() first (several hosts, one program); the "
  "clients are sharded over every device of every process (config.mesh_shape=-1 unless set)."
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator", None, "With --multihost: host:port of process 0 (default: detected on SLURM, "
  "Open MPI, Kubernetes and Cloud TPU, or JAX_COORDINATOR_ADDRESS)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "With --multihost: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "With --multihost: this process's id.")
_OVERWRITE = flags.DEFINE_bool(
  "overwrite", False, "Delete the workdir's metrics, checkpoints and summary first (start fresh)."
)
_VERBOSE = flags.DEFINE_bool(
  "verbose", False, "Library logs (orbax, absl) at INFO and full tracebacks for refused inputs."
)

EXIT_STOPPED = 130


class _StopFlag:
  """Set by SIGINT/SIGTERM: the run stops after the round in progress, inside a call of fused
  rounds too (:func:`fedtree.core.loop.make_multi_round`; over several processes, after the
  current call), checkpointing where it stopped; a second signal interrupts at once."""

  def __init__(self):
    self.signal = None

  def __call__(self) -> bool:
    return self.signal is not None

  def handler(self, signum, frame):
    if self.signal is not None:
      raise KeyboardInterrupt
    self.signal = signal.Signals(signum).name
    import jax

    when = "the round in progress" if jax.process_count() == 1 else "the current call of fused rounds"
    print(f"fedtree: {self.signal} received: stopping after {when} (again to abort)",
          file=sys.stderr, flush=True)

  def install(self) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
      signal.signal(s, self.handler)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from fedtree.experiment.fields import field

  config = _CONFIG.value
  if _CPU_DEVICES.value < 0:
    refuse(f"--cpu_devices={_CPU_DEVICES.value} must be >= 0 (0: leave the devices as they are)")
  if str(field(config, "dtype")) == "float64":  # float64 states: 64-bit mode process-wide
    import jax

    jax.config.update("jax_enable_x64", True)   # (orbax's threads restore float64 too)
  if _CPU_DEVICES.value > 0:  # XLA reads XLA_FLAGS when its CPU backend starts (checked below)
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_CPU_DEVICES.value}"
    ).strip()
    with config.unlocked():
      config.mesh_shape = _CPU_DEVICES.value
  import jax

  if _CPU_DEVICES.value > 0 and len(jax.devices("cpu")) != _CPU_DEVICES.value:
    refuse(
      f"--cpu_devices={_CPU_DEVICES.value} did not take effect ({len(jax.devices('cpu'))} CPU "
      f"devices): the JAX backend was started before the flag was read"
    )
  if _MULTIHOST.value:
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":  # CPU collectives across processes
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    given = dict(coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value,
                 process_id=_PROCESS_ID.value)
    jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None})
    if field(config, "mesh_shape") is None:  # the clients over every device of every process
      with config.unlocked():
        config.mesh_shape = -1
  from fedtree.experiment.runner import train_and_evaluate

  if not _VERBOSE.value:
    quiet_logs()
  print(f"fedtree: devices {jax.devices()}", file=sys.stderr, flush=True)
  stop = _StopFlag()
  stop.install()
  try:
    train_and_evaluate(config, _WORKDIR.value, overwrite=_OVERWRITE.value, should_stop=stop)
  except KeyboardInterrupt:  # a second signal: abort now, one line, no traceback
    if _VERBOSE.value:
      raise
    print(f"fedtree: aborted by a second {stop.signal or 'SIGINT'}: the rounds since the last "
          "checkpoint are lost; re-running the command resumes from that checkpoint (if any)",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_STOPPED)  # no interpreter shutdown: JAX's and orbax's threads may be mid-call
  except Exception as e:  # noqa: BLE001 (one clear line; the traceback behind --verbose)
    if _VERBOSE.value:
      raise
    from fedtree.experiment.results import RunStopped

    print(f"fedtree: {'stopped' if isinstance(e, RunStopped) else 'error'}: {_one_line(e)}",
          file=sys.stderr)
    if not isinstance(e, RunStopped):
      print("fedtree: (run with --verbose for the traceback)", file=sys.stderr)
    sys.exit(EXIT_STOPPED if isinstance(e, RunStopped) else 1)


def refuse(message: str) -> None:
  """Exits with status 1 after one line ``fedtree: error: <message>`` on stderr."""
  print(f"fedtree: error: {message}", file=sys.stderr, flush=True)
  sys.exit(1)


def quiet_logs() -> None:
  """Library logs (absl, orbax) at WARNING: the terminal shows progress and results only."""
  import logging as pylogging

  logging.set_verbosity(logging.WARNING)
  for name in ("absl", "orbax", "jax"):
    pylogging.getLogger(name).setLevel(pylogging.WARNING)


def _one_line(e: BaseException) -> str:
  """The message of a flag-parsing error on one line (ml_collections wraps a ``KeyError``
  naming a mistyped field, with its "Did you mean" hint, in an ``AttributeError``)."""
  while e.args and isinstance(e.args[0], BaseException):
    e = e.args[0]
  text = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
  if "Traceback (most recent call last)" in text:  # an error raised by the config file itself
    head = text.split("Traceback (most recent call last)")[0]
    last = [line for line in text.splitlines() if line.strip()][-1]
    text = f"{head} {last.strip()}"
  return " ".join(text.split())


def _config_arg(argv: list[str]) -> str | None:
  for i, a in enumerate(argv[1:], 1):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def check_new_fields(argv: list[str]) -> None:
  """Refuses a ``--config.<path>`` the config file does not list, unless it is a field of a run
  (``config.runs.<label>.<field>...``: any parameter of the run's algorithm, checked against its
  factory by :mod:`fedtree.experiment.registry`), naming the closest listed field."""
  import difflib

  given = config_flags.get_override_values(flags.FLAGS["config"])
  if not given:
    return
  from ml_collections.config_flags import config_flags as parsers

  pristine = parsers.ConfigFileFlagParser(name="config").parse(_config_arg(argv))
  for path in _flat_paths(given):
    parts = path.split(".")
    if parts[0] == "runs" and len(parts) >= 3 and parts[1] in pristine.runs:
      continue
    node = pristine
    for i, part in enumerate(parts):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(["config", *parts[:i]])
        near = difflib.get_close_matches(part, list(node.keys()) if hasattr(node, "keys") else [], n=1)
        hint = f' Did you mean "{near[0]}"?' if near else ""
        refuse(f"--config.{path}: {where} has no field {part!r}.{hint} The command line sets the "
               "fields the config file lists, and any parameter of a run's algorithm under "
               "config.runs.<label>")
      node = node[part]


def split_new_runs(argv: list[str]) -> tuple[list[str], list[tuple[list[str], str]]]:
  """``(argv without them, [(path, value)])`` of the ``--config.runs.<label>.<field>...=<value>``
  flags whose ``<label>`` the config file has no run of, or whose section the file's run does not
  have (``--config.runs.fedavg.model.norm=batch`` on a run without a ``model`` section):
  ml_collections cannot create the ConfigDict, so :func:`add_new_runs` adds them after the parse (a
  new run from the command line: ``--config.runs.permfl.algorithm=pfedmt
  --config.runs.permfl.lam=15``). ``path`` is ``[label, field, ...]``."""
  if not any(a.startswith("--config.runs.") for a in argv[1:]):
    return argv, []
  path = _config_arg(argv)
  if path is None:
    return argv, []
  from ml_collections.config_flags import config_flags as parsers

  try:
    runs = parsers.ConfigFileFlagParser(name="config").parse(path).runs
  except Exception:  # noqa: BLE001 (a broken config file: absl's parse reports it)
    return argv, []

  def missing(parts: list[str]) -> bool:   # a new run, or a section its run does not have
    node = runs
    for part in parts[:-1]:
      if not hasattr(node, "keys") or part not in node:
        return True
      node = node[part]
    return False

  kept, new = [argv[0]], []
  i = 1
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config.runs."):
      name, eq, value = a[len("--config.runs."):].partition("=")
      parts = name.split(".")
      if len(parts) >= 2 and missing(parts):
        if not eq:
          if i + 1 >= len(argv):
            refuse(f"{a} needs a value ({a}=<value>)")
          value, i = argv[i + 1], i + 1
        new.append((parts, value))
        i += 1
        continue
    kept.append(a)
    i += 1
  return kept, new


def _literal(text: str):
  """A command-line value as ml_collections reads a new field: a Python literal, else the text."""
  import ast

  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def add_new_runs(config, new: list[tuple[list[str], str]]) -> None:
  """Adds the runs of :func:`split_new_runs` to ``config.runs`` (their fields are then checked
  against the algorithm's factory, as every run's are)."""
  import ml_collections

  for parts, value in new:
    node = config.runs
    for part in parts[:-1]:
      if part not in node or node[part] is None:
        node[part] = ml_collections.ConfigDict()
      node = node[part]
      if not isinstance(node, ml_collections.ConfigDict):
        refuse(f"--config.runs.{'.'.join(parts)}: config.runs.{'.'.join(parts[:-1])} is not a section")
    node[parts[-1]] = _literal(value)


def switch_model(config, argv: list[str]) -> None:
  """A model named on the command line (``--config.model.name=logreg``) instead of the config
  file's leaves behind the file's fields of the old model (``hidden`` of its ``mlp``), which the
  new one would refuse: they are dropped, with a line on stderr saying which. Fields given on the
  command line are kept (and checked by the model)."""
  given = _flat_paths(config_flags.get_override_values(flags.FLAGS["config"]) or {})
  if "model.name" not in given or "model" not in config:
    return
  from ml_collections.config_flags import config_flags as parsers

  from fedtree.models import model_fields

  pristine = parsers.ConfigFileFlagParser(name="config").parse(_config_arg(argv))
  old, new = pristine.get("model", {}).get("name", None), config.model.name
  takes = model_fields(new)
  if old == new or takes is None:   # (an unknown name: build_model refuses it, listing the models)
    return
  dropped = [f for f in list(config.model) if f != "name" and f not in takes and f in pristine.model
             and f"model.{f}" not in given]
  for f in dropped:
    del config.model[f]
  if dropped:
    shown = {f: _plain(pristine.model[f]) for f in dropped}
    print(f"fedtree: model.name={new!r} replaces the config file's {old!r}: its model field(s) {shown} are "
          f"left out ({new!r} takes {sorted(takes)})", file=sys.stderr, flush=True)


def _plain(v):
  return v.to_dict() if hasattr(v, "to_dict") else v


def _flat_paths(d, prefix="") -> list[str]:
  out = []
  for k, v in d.items():
    path = f"{prefix}{k}"
    out.extend(_flat_paths(v, path + ".") if isinstance(v, dict) else [path])
  return out


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parse, with every refused flag (a mistyped config field, a bad value, a missing or
  broken config file) reported as one line; ``--verbose`` keeps the traceback."""
  if "--verbose" not in argv[1:]:  # ml_collections' own warnings (e.g. get_config returned None)
    import logging as pylogging

    pylogging.getLogger("absl").setLevel(pylogging.ERROR)
  try:
    argv, new_runs = split_new_runs(argv)
    if new_runs:
      sys.argv = list(argv)   # (the config flag reads its overrides from sys.argv)
    rest = flags.FLAGS(argv)
    if flags.FLAGS["config"].value is not None:
      check_new_fields(argv)
      add_new_runs(flags.FLAGS["config"].value, new_runs)
      switch_model(flags.FLAGS["config"].value, argv)
    return rest
  except Exception as e:  # noqa: BLE001
    if "--verbose" in argv[1:]:
      raise
    text = _one_line(e)
    if "--config must have a value other than None" in text:
      path = _config_arg(argv)
      text = ("--config is required, e.g. --config=configs/quickstart.py" if path is None else
              f"--config={path}: its get_config() returned None (a missing return statement?)")
    print(f"fedtree: error: {text}", file=sys.stderr)
    print("fedtree: (run with --verbose for the traceback; --helpfull lists the flags)",
          file=sys.stderr)
    sys.exit(1)


def run():
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
