r"""Launch an experiment from a config file.

  python -m fedtree.main --config=configs/quickstart.py --workdir=/tmp/quickstart
  python -m fedtree.main --config=configs/quickstart.py --config.rounds=5 --workdir=/tmp/q

Every config field can be overridden with ``--config.<field>=<value>`` (ml_collections).
Metrics go to the terminal (progress bar), to ``<workdir>/metrics.jsonl`` and a final
summary to ``<workdir>/summary.json``.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics and summaries.")
_MULTIHOST = flags.DEFINE_bool(
  "multihost", False, "Call jax.distributed.initialize() first (several hosts, one program)."
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax

  if _MULTIHOST.value:
    jax.distributed.initialize()
  from fedtree.experiment import train_and_evaluate

  logging.info("JAX devices: %s", jax.devices())
  train_and_evaluate(_CONFIG.value, _WORKDIR.value)


def run():
  flags.mark_flags_as_required(["config"])
  app.run(main)


if __name__ == "__main__":
  run()
