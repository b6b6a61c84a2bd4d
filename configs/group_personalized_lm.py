r"""Group personalized FL (paper 000) on its real task: federated language modeling.

  python -m fedtree.main --config=configs/group_personalized_lm.py --workdir=/tmp/gp_lm
  python -m fedtree.main --config=configs/group_personalized_lm.py:text_dir \
      --config.data.root=/path/to/corpus --workdir=/tmp/gp_lm_dir
  python -m fedtree.main --config=configs/group_personalized_lm.py:leaf_shakespeare \
      --config.data.root=/path/to/leaf/data/shakespeare/data --workdir=/tmp/gp_lm_leaf

FL, PerFL, GroupFL and GroupPerFL (``algorithm="grouppfl"``, the pipeline of
``configs/group_personalized.py``) with an LSTM language model (:mod:`fedtree.models.lm`)
on text that ships with Python: the standard-library docstring corpus
(:func:`fedtree.datasets.text.stdlib_corpus`): one client per module of 7 packages, one
group per package (the paper's wiki setup: a page per client, a topic per group), each
module's sentences split 75/25 into train and evaluation, a word vocabulary built from the
training sentences only. Reports (workdir): ``grouppfl_report.md`` with per-group
perplexity (Tables 3/6) at token level (``exp(total NLL / total tokens)`` of each group's
evaluation sentences, EOS included) and at sentence level (the paper's "aggregated at
sentence level": ``exp`` of the mean over sentences of each sentence's mean token NLL; see
:func:`fedtree.core.metrics.perplexities`), next-token accuracy, Table 4 costs,
``grouppfl_fig1.png`` (Fig. 1: per-client relative perplexity change of GroupPerFL vs PerFL)
and ``plot_perplexity.png`` (both perplexities over rounds).

Paper vs here: LSTM 2x512 with character-aware embeddings of 100 and a 33K vocabulary ->
1 layer of 128 units, a 1,500-word table embedding of 64 (``model.embedding="chars"`` gives
the character-aware CNN); T = 20, T_g = 10, K_l = 5 epochs swept over 4 rates -> the same
rounds with cohorts of 10 clients, K_l = 2 epochs over rates (0.1, 0.5), each client capped
at 48 sentences so that the whole config runs in minutes on a 2-core CPU.

``:text_dir``: ``<root>/<group>/<client>.txt``, one sentence per line; ``:leaf_shakespeare``:
LEAF's Shakespeare JSON, roles grouped by play (``group_key="hierarchies"``), character
level. Both cache their converted arrays in ``config.data.cache_dir`` (default
``/tmp/fedtree_cache``; ``--config.data.cache_dir=None`` converts every time); the stdlib
variant has no cache (parsing the docstrings takes about a second). The report tables name
the groups as the data does (packages, ``<group>`` folders, plays). ``model.embedding="chars"``
(with ``model.char_len``, default 16) builds the character table from the data's vocabulary.

Measured (default variant, Python 3.11 stdlib: 88 clients, 1,953 train / 615 evaluation
sentences; 1 min 40 s wall and 2 min 25 s of CPU time for the 20 rounds and the fine-tuning, measured on
2026-12-07 on the project's quiet 2-core machine without the plots). Token-level word perplexity per
group (Table 3/6 style; lower is better; ``mproc``: multiprocessing) and the share of clients whose
perplexity is lower than with PerFL (Fig. 1; ``python -m benchmarks.config_figures
--config=configs/group_personalized_lm.py`` checks the table):

  run       model       asyncio  email  mproc  xml    importlib  tkinter  unittest  all    ppl<PerFL%
  grouppfl  FL          221.0    280.9  273.7  256.5  229.4      247.6    273.2     252.0  0.0
  grouppfl  PerFL       150.7    218.8  196.9  192.5  165.9      161.6    210.0     182.9  -
  grouppfl  GroupFL     153.8    194.2  174.5  188.0  141.8      173.6    193.6     173.1  65.9
  grouppfl  GroupPerFL  123.4    172.2  155.1  163.4  126.7      131.0    170.8     146.9  94.3

GroupPerFL beats PerFL on all 7 groups and GroupFL beats FL on all 7 (the paper's expected
result holds here). Fig. 1: 94.3% of the 88 clients have lower perplexity with GroupPerFL
than with PerFL, median relative change -19.5%. Next-token accuracy 11.1% (FL), 11.8%
(PerFL), 11.1% (GroupFL), 12.3% (GroupPerFL). Table 4 costs per client: communication 4.55
(FL, PerFL) vs 19.77 models (GroupFL, GroupPerFL); computation 2.27 / 4.27 / 9.89 / 11.89
local epochs. The selected fine-tuning rate was 0.5 for both PerFL and GroupPerFL.
"""

import ml_collections

from fedtree.algorithms.hierarchical.grouppfl.report import perplexity_figures
from fedtree.experiment.fields import declare_runner_fields
from fedtree.experiment.sweep import default_sweep

STDLIB_PACKAGES = ("asyncio", "email", "multiprocessing", "xml", "importlib", "tkinter", "unittest")
FIGURES = perplexity_figures(tuple("mproc" if g == "multiprocessing" else g for g in STDLIB_PACKAGES))
"""The docstring's figures (benchmarks/config_figures.py): each group's perplexity, all clients', Fig. 1's."""


def get_config(variant: str = "stdlib") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.rounds = 20               # T, global FL rounds
  c.eval_every = 20
  c.rounds_per_call = 10
  c.chunk_size = None
  c.eval_chunk_size = 16
  c.progress = True

  if variant == "stdlib":
    c.data = ml_collections.ConfigDict(dict(
      name="stdlib_text", packages=STDLIB_PACKAGES, min_sentences=8, max_sentences=48,
      seq_len=20, vocab_size=1500, level="word", test_fraction=0.25, seed=0,
    ))
  elif variant == "text_dir":
    c.data = ml_collections.ConfigDict(dict(
      name="text_dir", root="", seq_len=20, vocab_size=10_000, level="word", test_fraction=0.25,
      seed=0, cache_dir="/tmp/fedtree_cache",
    ))
  elif variant == "leaf_shakespeare":
    c.data = ml_collections.ConfigDict(dict(
      name="leaf", root="", kind="shakespeare", group_key="hierarchies", seq_len=80,
      cache_dir="/tmp/fedtree_cache",
    ))
  else:
    raise ValueError(f"variant={variant!r}; choose 'stdlib', 'text_dir' or 'leaf_shakespeare'")
  c.topology = ml_collections.ConfigDict(dict(kind="groups"))   # root -> groups -> clients
  c.model = ml_collections.ConfigDict(dict(name="lstm_lm", embed=64, hidden=128, layers=1))
  c.local = ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=0.5, batch_size=8, epochs=1, steps=None,   # K = 1, B = 8
  ))

  c.runs = ml_collections.ConfigDict()
  c.runs.grouppfl = ml_collections.ConfigDict(dict(
    algorithm="grouppfl",
    group_rounds=10,                                        # T_g
    cohort_size=10,
    global_server=ml_collections.ConfigDict(dict(name="fedadam", learning_rate=0.01, tau=1e-3)),
    group_server=ml_collections.ConfigDict(dict(name="fedadam", learning_rate=0.01, tau=1e-3)),
    finetune=ml_collections.ConfigDict(dict(
      epochs=2, learning_rates=(0.1, 0.5), optimizer="sgd",     # K_l, η_{i,l}
    )),
    select_by="loss",
    stages=("global", "group", "finetune"),
    histogram_metric="perplexity",
    histogram_group=None,
  ))
  c.mesh_shape = ml_collections.config_dict.placeholder(int)  # clients over devices: -1 = all
  c.sweep = default_sweep()
  return declare_runner_fields(c)   # every runner field settable from the command line
