"""The published setups of the standard federated tasks, as data the configs of
``configs/benchmarks/`` read (docs/standard-tasks.md).

* :data:`AFO_TASKS`, :data:`AFO_LOG10`: Reddi et al. 2021 ("Adaptive federated optimization",
  AFO), as google-research/federated ``optimization/docs/hyperparameters.md`` lists them: the
  cross-task setup (clients per round, client batch size, total rounds; one client epoch) and, for
  every task and method, the best client learning rate, server learning rate and adaptivity
  epsilon, in base-10 logs. :func:`afo_runs` makes one run per method.
* :func:`flowertune_config`, :func:`flowertune_task`: a FlowerTune LLM challenge's published setting
  and its benchmarks (``configs/llm/``).
* The methods' server optimizers as the reference code builds them (its README and
  ``hyperparameters.md``): FedAvg is server SGD, FedAvgM server SGD with momentum 0.9, FedAdam
  Keras' Adam and FedYogi the repository's Yogi (``utils/optimizers/yogi.py``), both with
  ``beta1 = 0.9``, ``beta2 = 0.999`` (Keras' defaults), initial accumulator 0, the bias-corrected
  step ``lr sqrt(1 - beta2^t) / (1 - beta1^t)`` and epsilon outside the square root:
  :func:`fedtree.core.server.fedopt` with ``bias_correction=True, initial_accumulator=0``.

The tests (``tests/test_standard_tasks.py``) hold their own copy of these tables, written from the
sources, and check every shipped config against it.
"""

from __future__ import annotations

import ml_collections

AFO_METHODS = ("fedavg", "fedavgm", "fedadam", "fedyogi")
"""The AFO methods the benchmark configs run (the paper also tunes FedAdagrad)."""

AFO_TASKS: dict[str, dict[str, int]] = {
  # hyperparameters.md, "Default values": clients per round, client batch size, total rounds
  "cifar100_image": {"clients_per_round": 10, "batch_size": 20, "rounds": 4000},
  "emnist_character": {"clients_per_round": 10, "batch_size": 20, "rounds": 1500},
  "shakespeare_character": {"clients_per_round": 10, "batch_size": 4, "rounds": 1200},
  "stackoverflow_word": {"clients_per_round": 50, "batch_size": 16, "rounds": 1500},
}
"""AFO's cross-task setup per task (one client epoch per round for all)."""

AFO_LOG10: dict[str, dict[str, tuple[float, float, float | None]]] = {
  # task: {method: (log10 client learning rate, log10 server learning rate, log10 epsilon)}
  "cifar100_image": {"fedadam": (-1.5, 0.0, -1.0), "fedyogi": (-1.5, 0.0, -1.0),
                     "fedavgm": (-1.5, 0.0, None), "fedavg": (-1.0, 0.5, None)},
  "emnist_character": {"fedadam": (-1.5, -2.5, -4.0), "fedyogi": (-1.5, -2.5, -4.0),
                       "fedavgm": (-1.5, -0.5, None), "fedavg": (-1.0, 0.0, None)},
  "shakespeare_character": {"fedadam": (0.0, -2.0, -3.0), "fedyogi": (0.0, -2.0, -3.0),
                            "fedavgm": (0.0, -0.5, None), "fedavg": (0.0, 0.0, None)},
  "stackoverflow_word": {"fedadam": (-0.5, -2.0, -5.0), "fedyogi": (-0.5, -2.0, -5.0),
                         "fedavgm": (-0.5, 0.0, None), "fedavg": (-0.5, 0.0, None)},
}
"""AFO's best hyperparameters (hyperparameters.md, "Best hyperparameters")."""


def afo_server(method: str, server_log10: float, epsilon_log10: float | None) -> dict:
  """The server optimizer config of an AFO ``method`` (module docstring).

  Raises:
    ValueError: an unknown ``method``, or an adaptive one without epsilon.
  """
  lr = 10.0 ** server_log10
  if method == "fedavg":
    return {"name": "fedavg", "learning_rate": lr}
  if method == "fedavgm":
    return {"name": "fedavgm", "learning_rate": lr, "momentum": 0.9}
  if method in ("fedadam", "fedyogi"):
    if epsilon_log10 is None:
      raise ValueError(f"AFO method {method!r} needs an epsilon")
    return {"name": method, "learning_rate": lr, "b1": 0.9, "b2": 0.999, "tau": 10.0 ** epsilon_log10,
            "initial_accumulator": 0.0, "bias_correction": True}
  raise ValueError(f"AFO method {method!r}; choose one of {AFO_METHODS}")


def afo_runs(task: str, methods: tuple[str, ...] = AFO_METHODS) -> ml_collections.ConfigDict:
  """One run per AFO method on ``task``: FedOpt over every client with the task's clients per round,
  the method's client learning rate (``local_learning_rate``) and server optimizer, clients weighted
  by their examples (TFF's default).

  Raises:
    ValueError: an unknown task or method.
  """
  if task not in AFO_LOG10:
    raise ValueError(f"AFO task {task!r}; choose one of {tuple(AFO_LOG10)}")
  runs = ml_collections.ConfigDict()
  for method in methods:
    if method not in AFO_LOG10[task]:
      raise ValueError(f"AFO method {method!r}; choose one of {tuple(AFO_LOG10[task])}")
    client, server, eps = AFO_LOG10[task][method]
    runs[method] = ml_collections.ConfigDict(dict(
      algorithm="fedopt", cohort_size=AFO_TASKS[task]["clients_per_round"], weighting="examples",
      local_learning_rate=10.0 ** client, server=afo_server(method, server, eps)))
  return runs


def afo_local(task: str) -> ml_collections.ConfigDict:
  """``config.local`` of an AFO task: client SGD, the task's batch size, one epoch, and the FedAvg
  column's client learning rate (each run sets its own: :func:`afo_runs`)."""
  return ml_collections.ConfigDict(dict(
    optimizer="sgd", learning_rate=10.0 ** AFO_LOG10[task]["fedavg"][0],
    batch_size=AFO_TASKS[task]["batch_size"], epochs=1, steps=None))


def variant_flags(variant: str | None, allowed: tuple[str, ...], config: str) -> set[str]:
  """The comma-separated flags of a config ``variant`` (``configs/benchmarks/x.py:iid,offline``).

  Raises:
    ValueError: naming the config, the flag and the allowed ones.
  """
  flags = {f.strip() for f in (variant or "").split(",") if f.strip()}
  bad = sorted(flags - set(allowed))
  if bad:
    raise ValueError(f"configs/benchmarks/{config}.py:{variant}: unknown variant {bad[0]!r}; choose a "
                     f"comma-separated subset of {allowed}")
  return flags


QUICK_ROUNDS = 3
"""The rounds of a config's ``quick`` flag: the setup checked end to end."""


def finish_variant(c: ml_collections.ConfigDict, config: str, flags: set[str]) -> ml_collections.ConfigDict:
  """``c`` with what its variant ``flags`` add: without ``offline``, ``without_data`` names the variant
  that runs without the data files (the same flags and ``offline``: a missing-data refusal names it
  beside the preparation command); with ``quick``, :data:`QUICK_ROUNDS` rounds of the first run,
  scored at the end, no checkpoint (``:offline,quick``: the setup checked end to end)."""
  if "offline" not in flags:
    kept = flags - {"quick", "store"}   # the split's flags (iid, noniid); a store is data too
    c.without_data = f"configs/benchmarks/{config}.py:{','.join(sorted(kept | {'offline'}))}"
  if "quick" in flags:
    c.rounds, c.eval_every, c.rounds_per_call, c.checkpoint_every = QUICK_ROUNDS, QUICK_ROUNDS, 1, 0
    c.only = c.run_order[0]
  return c


def flowertune_task(kind: str, format: str, *, hub: str | None = None, **fields) -> dict:
  """One benchmark of a FlowerTune config (``config.tasks.<name>``): ``"generation"`` (FlowerTune's
  Alpaca prompt) or ``"choice"`` (the raw question) over sequences of 512 tokens, its file
  (``path``) and a cap on its rows (``limit``) set from the command line; ``hub`` the Hugging Face
  dataset it is read from, ``fields`` further ones (``max_new_tokens``)."""
  from ml_collections import config_dict

  template = "flowertune" if kind == "generation" else "raw"
  return dict(kind=kind, path=config_dict.placeholder(str), **({} if hub is None else {"hub": hub}),
              format=format, template=template, seq_len=512, **fields, limit=config_dict.placeholder(int))


def flowertune_config(hub: str, *, num_clients: int, cohort_size: int, tasks: dict | None = None,
                      **data) -> ml_collections.ConfigDict:
  """A FlowerTune challenge's published setting (``configs/llm/flowertune_*.py``): a pretrained checkpoint
  (``config.model.checkpoint``) fine-tuned by FedAvg on LoRA r = 32, alpha = 64 over ``q_proj`` and
  ``v_proj`` (an int8 base), ``num_clients`` IID clients of the instruction data ``hub`` names
  (``config.data.path``, saved once), ``cohort_size`` of them a round (one vmapped step), 200 rounds of
  10 AdamW steps of batch 16 at 5e-5, sequences of 512 tokens in FlowerTune's Alpaca prompt, a 200,000 MB
  budget; ``tasks`` its benchmarks (``config.tasks``), ``data`` further ``config.data`` fields."""
  from ml_collections import config_dict

  from fedtree.experiment.fields import declare_runner_fields
  from fedtree.experiment.sweep import default_sweep

  c = ml_collections.ConfigDict()
  c.seed, c.rounds, c.eval_every, c.rounds_per_call = 0, 200, 200, 1
  c.chunk_size = "None"   # the cohort in one vmapped step over the shared base
  c.eval_chunk_size = "4"
  c.progress = True
  c.communication_budget_MB = 200000.0
  c.model = ml_collections.ConfigDict(
    dict(name="pretrained", checkpoint=config_dict.placeholder(str), dtype="bfloat16", remat=True))
  c.data = ml_collections.ConfigDict(dict(
    name="instructions", path=config_dict.placeholder(str), hub=hub, tokenizer=c.model.get_ref("checkpoint"),
    format="alpaca", template="flowertune", **data, seq_len=512, partitioner="iid",
    partitioner_args=dict(num_clients=num_clients), test_fraction=0.01, seed=0))
  c.topology = ml_collections.ConfigDict(dict(kind="flat"))
  c.local = ml_collections.ConfigDict(dict(optimizer="adamw", learning_rate=5e-5, batch_size=16, steps=10))
  if tasks is not None:
    c.tasks = ml_collections.ConfigDict(tasks)
  lora = dict(kind="lora", rank=32, alpha=64.0, targets=(r"(q_proj|v_proj)/kernel$",), base_dtype="int8")
  fedavg = dict(algorithm="fedavg", cohort_size=cohort_size, adapters=lora)
  c.runs = ml_collections.ConfigDict(dict(fedavg=fedavg))
  c.mesh_shape = config_dict.placeholder(int)
  c.sweep = default_sweep()
  return declare_runner_fields(c)
