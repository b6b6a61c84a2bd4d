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
   personal models are adapters; :mod:`fedtree.toolbox.lora`) and ``full`` (every parameter).

The report of each run (``lora_report.md``, ``full_report.md`` in the workdir) gives
perplexity per group for FL, PerFL, GroupFL and GroupPerFL; the run ``pretrained`` / model
``base`` is the pretrained model before any fine-tuning. Communication is counted in models by
the GroupPerFL report: with adapters a "model" is the adapters, so bytes sent per client = that
count x the adapter bytes (below).

Measured (Python 3.11 stdlib; the notebook ``colab/peft_lm.ipynb`` runs the same config): 3 min 16 s
wall and 4 min 53 s of CPU time for pretraining and both pipelines (measured on 2026-12-07 on the
project's quiet 2-core machine, by the command that checks the table below). The adapters use the
factored forward where a dense layer uses the kernel (the output layer; the LSTM's ``w_x``/``w_h``
are merged, :mod:`fedtree.toolbox.lora`); the numbers below are the same with the merged forward,
which the figures were first measured with. Pretraining: 5,436 sentences, 400 steps of 32, training
loss 5.531 -> 3.930. Token-level word perplexity per group on the held-out packages (lower is
better; ``mproc``: multiprocessing), and the share of clients whose perplexity is lower than with
PerFL (Fig. 1); ``pretrained``/``base`` is the pretrained model before any federated fine-tuning
(``python -m benchmarks.config_figures --config=configs/peft_lm.py`` checks the table):

  run         model       asyncio  email  mproc  xml    importlib  tkinter  unittest  all    ppl<PerFL%
  pretrained  base        121.0    141.8  170.2  123.1  108.6      109.3    138.1     127.6  -
  lora        FL          109.7    137.1  148.9  123.5  107.4      118.0    143.9     124.0  1.1
  lora        PerFL       83.0     111.8  113.3  99.3   84.6       83.1     111.7     96.3   -
  lora        GroupFL     82.9     104.6  104.2  97.0   77.4       86.5     107.4     92.9   69.3
  lora        GroupPerFL  65.1     91.3   90.8   84.2   68.3       70.4     93.6      78.5   96.6
  full        FL          98.2     125.5  138.5  112.7  94.7       104.2    128.4     111.8  2.3
  full        PerFL       78.0     106.3  99.0   93.7   79.3       73.7     102.1     89.5   -
  full        GroupFL     85.7     109.3  105.5  98.6   80.7       86.4     105.4     95.3   26.1
  full        GroupPerFL  71.6     96.9   87.3   86.4   72.2       67.4     92.7      81.7   94.3

Fine-tuning lowers perplexity 127.6 -> 78.5 with adapters and 127.6 -> 81.7 with the full model
(GroupPerFL, all clients). Global FL alone moves the base less with adapters (124.0 vs 111.8 in
10 rounds); the group stage and the personal fine-tuning catch up and pass it (GroupPerFL
better than full on 4 of 7 groups). GroupPerFL beats PerFL for 96.6% (lora) and 94.3% (full)
of the 88 clients. Selected fine-tuning rate: 0.1 (lora), 0.5 (full).

Bytes per client: the model has 388,316 parameters (1.553 MB); the rank-8 adapters 22,752
(91.0 KB, 5.9%). A GroupPerFL client moves 9.89 models on average (down + up; FL 2.27), so
0.90 MB with adapters against 15.36 MB with the full model. The runner's table counts the
whole pipeline on every edge (``up MB``/``down MB``): 39.59 MB each way with adapters against
675.67 MB with the full model. Memory (the runner's estimate
before each run, ``jax.eval_shape`` of the state): state 4.09 MiB (lora: the base once plus
adapters of the root, 7 groups and their FedAdam states) against 44.4 MiB (full).
"""

import ml_collections

from fedtree.algorithms.hierarchical.grouppfl.report import perplexity_figures
from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

STDLIB_PACKAGES = ("asyncio", "email", "multiprocessing", "xml", "importlib", "tkinter", "unittest")
PRETRAIN_PACKAGES = ("concurrent", "http", "json", "logging", "urllib", "collections", "ctypes", "sqlite3",
                     "html", "wsgiref", "xmlrpc", "zoneinfo", "idlelib", "lib2to3", "distutils", "curses",
                     "dbm", "encodings", "venv", "re", "tomllib")
LORA_TARGETS = (r"(^|/)w_[xh]$", r"^out/kernel$")


GROUPS = ("asyncio", "email", "mproc", "xml", "importlib", "tkinter", "unittest")
"""The federated data's groups in their order (headers of the figures; ``mproc``: multiprocessing)."""
FIGURES = perplexity_figures(GROUPS)   # (config_figures) each group's perplexity, all clients', Fig. 1's


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
  return declare_runner_fields(c)
