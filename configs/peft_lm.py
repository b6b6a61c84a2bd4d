r"""Federated fine-tuning of a pretrained language model with LoRA adapters vs the full model
(issue 26): paper 000's FL -> GroupFL -> GroupPerFL on held-out groups.

  python -m fedtree.main --config=configs/peft_lm.py --workdir=/tmp/peft_lm

1. **Pretraining, offline, in the same command** (``config.pretrain``,
   :mod:`fedtree.experiment.pretrain`): the LSTM language model of
   ``configs/group_personalized_lm.py`` is trained centrally on the docstrings of 21
   standard-library packages *other* than the 7 of the federated data, encoded with the
   federated data's vocabulary. ``pretrain.save`` writes it for a later run's ``init_params``.
2. **Federated fine-tuning on the held-out groups**, the same GroupPerFL pipeline twice from
   the same pretrained model, at equal rounds: ``lora`` (``adapters: {kind: lora, rank: 8,
   alpha: 16, targets: LSTM input/recurrent matrices and the output layer}``; the base is
   frozen, one copy shared by every client and node; the global, group and fine-tuned
   personal models are adapters; :mod:`fedtree.core.lora`) and ``full`` (every parameter).

The report of each run (``lora_report.md``, ``full_report.md`` in the workdir) gives
perplexity per group for FL, PerFL, GroupFL and GroupPerFL; the run ``pretrained`` / model
``base`` is the pretrained model before any fine-tuning. Communication is counted in models by
the GroupPerFL report: with adapters a "model" is the adapters, so bytes sent per client = that
count x the adapter bytes (below).

Measured (see the notebook ``colab/006_peft_lm.ipynb`` for the executed run and its tables):
MEASURED_PLACEHOLDER
"""

import ml_collections

from fedtree.experiment.sweep import default_sweep

STDLIB_PACKAGES = ("asyncio", "email", "multiprocessing", "xml", "importlib", "tkinter", "unittest")
PRETRAIN_PACKAGES = ("concurrent", "http", "json", "logging", "urllib", "collections", "ctypes", "sqlite3",
                     "html", "wsgiref", "xmlrpc", "zoneinfo", "idlelib", "lib2to3", "distutils", "curses",
                     "dbm", "encodings", "venv", "re", "tomllib")
LORA_TARGETS = (r"(^|/)w_[xh]$", r"^out/kernel$")


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 10               # T, global FL rounds
  c.eval_every = 10
  c.rounds_per_call = 5
  c.chunk_size = None
  c.eval_chunk_size = 16
  c.progress = True

  c.data = ml_collections.ConfigDict(dict(
    name="stdlib_text", packages=STDLIB_PACKAGES, min_sentences=8, max_sentences=48,
    seq_len=20, vocab_size=1500, level="word", test_fraction=0.25, seed=0,
  ))
  c.topology = ml_collections.ConfigDict(dict(kind="groups"))   # root -> groups -> clients
  c.model = ml_collections.ConfigDict(dict(name="lstm_lm", embed=64, hidden=128, layers=1))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=0.5, batch_size=8, epochs=1, steps=None,   # K = 1, B = 8
  ))
  # Stdlib packages left out of the federated data (sentences no client holds), ~5,400 sentences.
  c.pretrain = ml_collections.ConfigDict(dict(
    packages=PRETRAIN_PACKAGES, max_sentences=None, steps=400, batch_size=32, optimizer="adam",
    learning_rate=3e-3, seed=0, save=None,
  ))

  def grouppfl(label, **extra):
    return ml_collections.ConfigDict(dict(
      algorithm="grouppfl", label=label,                      # report files <label>_report.md
      group_rounds=5,                                         # T_g
      cohort_size=10,
      global_server=ml_collections.ConfigDict(dict(name="fedadam", learning_rate=0.01, tau=1e-3)),
      group_server=ml_collections.ConfigDict(dict(name="fedadam", learning_rate=0.01, tau=1e-3)),
      finetune=ml_collections.ConfigDict(dict(epochs=2, learning_rates=(0.1, 0.5), optimizer="sgd")),
      select_by="loss", stages=("global", "group", "finetune"), histogram_metric="perplexity",
      **extra,
    ))

  c.runs = ml_collections.ConfigDict()
  c.runs.lora = grouppfl("lora", adapters=ml_collections.ConfigDict(dict(
    kind="lora", rank=8, alpha=16.0, targets=LORA_TARGETS)))
  c.runs.full = grouppfl("full")
  c.run_order = ("lora", "full")
  c.mesh_shape = ml_collections.config_dict.placeholder(int)
  c.sweep = default_sweep()
  return c
