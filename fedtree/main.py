r"""Launch an experiment from a config file.

  python -m fedtree.main --config=configs/quickstart.py --workdir=/tmp/quickstart
  python -m fedtree.main --config=configs/quickstart.py --config.rounds=5 --workdir=/tmp/q

Every config field can be overridden with ``--config.<field>=<value>`` (ml_collections).
Metrics go to the terminal (progress bar), to ``<workdir>/metrics.jsonl`` and a final
summary to ``<workdir>/summary.json``.

On a multi-core CPU, ``--cpu_devices=N`` (e.g. the number of cores) splits the host into N
XLA devices and shards the clients over them: ~1.7x the throughput of one device on 2 cores
(benchmarks/README.md).
"""

from __future__ import annotations

import os

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

  logging.info("JAX devices: %s", jax.devices())
  train_and_evaluate(config, _WORKDIR.value)


def run():
  flags.mark_flags_as_required(["config"])
  app.run(main)


if __name__ == "__main__":
  run()
