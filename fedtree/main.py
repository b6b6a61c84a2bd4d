r"""Launch an experiment from a config file.

  python -m fedtree.main --config=configs/quickstart.py --workdir=/tmp/quickstart
  python -m fedtree.main --config=configs/quickstart.py --config.rounds=5 --workdir=/tmp/q

Every config field can be overridden with ``--config.<field>=<value>`` (ml_collections).
Results (the final table, reports) go to stdout; progress and messages to stderr; metrics to
``<workdir>/metrics.jsonl`` and a final summary to ``<workdir>/summary.json``. Without
``--workdir`` nothing is saved (a warning says so). Re-running the same command resumes from
the workdir's checkpoints; a workdir of a different config is refused (``--overwrite`` starts
fresh). A refused input prints one line (``--verbose``: the traceback too). SIGINT/SIGTERM
stop after the current compiled call, keeping the last checkpoint.

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

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics and summaries.")
_CPU_DEVICES = flags.DEFINE_integer(
  "cpu_devices", 0, "On CPU: split the host into this many XLA devices and shard the clients "
  "over them (sets XLA_FLAGS before JAX starts, and config.mesh_shape). 0: leave as is."
)
_MULTIHOST = flags.DEFINE_bool(
  "multihost", False, "Call jax.distributed.initialize() first (several hosts, one program)."
)
_OVERWRITE = flags.DEFINE_bool(
  "overwrite", False, "Delete the workdir's metrics, checkpoints and summary first (start fresh)."
)
_VERBOSE = flags.DEFINE_bool(
  "verbose", False, "Library logs (orbax, absl) at INFO and full tracebacks for refused inputs."
)

EXIT_STOPPED = 130


class _StopFlag:
  """Set by SIGINT/SIGTERM: the run stops after its current compiled call (a second signal
  interrupts at once)."""

  def __init__(self):
    self.signal = None

  def __call__(self) -> bool:
    return self.signal is not None

  def handler(self, signum, frame):
    if self.signal is not None:
      raise KeyboardInterrupt
    self.signal = signal.Signals(signum).name
    print(f"fedtree: {self.signal} received: stopping after the current call (again to abort)",
          file=sys.stderr, flush=True)

  def install(self) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
      signal.signal(s, self.handler)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if _CPU_DEVICES.value < 0:
    raise app.UsageError(f"--cpu_devices={_CPU_DEVICES.value} must be >= 0")
  if _CPU_DEVICES.value > 0:  # XLA reads XLA_FLAGS when its CPU backend starts (checked below)
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_CPU_DEVICES.value}"
    ).strip()
    with config.unlocked():
      config.mesh_shape = _CPU_DEVICES.value
  import jax

  if _CPU_DEVICES.value > 0 and len(jax.devices("cpu")) != _CPU_DEVICES.value:
    raise app.UsageError(
      f"--cpu_devices={_CPU_DEVICES.value} did not take effect ({len(jax.devices('cpu'))} CPU "
      f"devices): the JAX backend was started before the flag was read"
    )
  if _MULTIHOST.value:
    jax.distributed.initialize()
  from fedtree.experiment.runner import train_and_evaluate

  if not _VERBOSE.value:
    quiet_logs()
  print(f"fedtree: devices {jax.devices()}", file=sys.stderr, flush=True)
  stop = _StopFlag()
  stop.install()
  try:
    train_and_evaluate(config, _WORKDIR.value, overwrite=_OVERWRITE.value, should_stop=stop)
  except Exception as e:  # noqa: BLE001 (one clear line; the traceback behind --verbose)
    if _VERBOSE.value:
      raise
    from fedtree.experiment.runner import RunStopped

    print(f"fedtree: {'stopped' if isinstance(e, RunStopped) else 'error'}: {e}", file=sys.stderr)
    if not isinstance(e, RunStopped):
      print("fedtree: (run with --verbose for the traceback)", file=sys.stderr)
    sys.exit(EXIT_STOPPED if isinstance(e, RunStopped) else 1)


def quiet_logs() -> None:
  """Library logs (absl, orbax) at WARNING: the terminal shows progress and results only."""
  import logging as pylogging

  logging.set_verbosity(logging.WARNING)
  for name in ("absl", "orbax", "jax"):
    pylogging.getLogger(name).setLevel(pylogging.WARNING)


def run():
  flags.mark_flags_as_required(["config"])
  app.run(main)


if __name__ == "__main__":
  run()
