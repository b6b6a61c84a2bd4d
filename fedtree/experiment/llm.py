"""The config side of pretrained language models (issue 50): the tokenizer a config names, its
instruction data (``config.data.name="instructions"``), its benchmarks (``config.tasks``) and its
communication budget (``config.communication_budget_MB``).

``config.tasks`` (optional): ``{name: {kind: "choice" | "generation", path, hub, split, format,
template, seq_len, limit, max_new_tokens, tokenizer}}``: every benchmark, prepared once
(:func:`load_tasks`) and scored on every run's global model at each evaluation
(:func:`fedtree.evaluation.llm.score_tasks`): ``<name>_accuracy`` (multiple choice by
log-likelihood, :func:`fedtree.datasets.instructions.choice_task`) or ``<name>_exact_match``
(greedy generation, :func:`fedtree.datasets.instructions.generation_task`). ``tokenizer`` defaults
to ``config.model.checkpoint``. A task whose ``path`` is ``None`` is not scored; a ``path`` that holds no
saved dataset is refused in one line naming the preparation (``hub``: the ``datasets.load_dataset``
arguments, e.g. ``"'cais/mmlu', 'all', split='test'"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ml_collections

TASK_KINDS = ("choice", "generation")
TASK_FIELDS = (
  "kind",
  "path",
  "hub",
  "split",
  "format",
  "template",
  "seq_len",
  "limit",
  "max_new_tokens",
  "tokenizer",
)


def tokenizer_of(directory: str | None, where: str):
  """The tokenizer of checkpoint ``directory`` (:func:`fedtree.models.load_tokenizer`).

  Raises:
    FileNotFoundError: no such directory, or one without tokenizer files (one line, naming ``where``).
  """
  from fedtree.models.pretrained import load_tokenizer

  if not directory or not os.path.isdir(str(directory)):
    raise FileNotFoundError(
      f"{where}={directory!r} is not a checkpoint directory with a tokenizer (a folder "
      f"written by save_pretrained; set config.model.checkpoint)"
    )
  tok = load_tokenizer(str(directory))
  if tok is None:
    raise FileNotFoundError(
      f"{where}={directory!r} holds no tokenizer files (tokenizer.json, tokenizer_config.json)"
    )
  return tok


def vocab_size_of(directory: str) -> int | None:
  """The ``vocab_size`` of a checkpoint's ``config.json`` (``None`` without one)."""
  path = os.path.join(str(directory), "config.json")
  if not os.path.exists(path):
    return None
  from fedtree.models.pretrained import read_config

  size = read_config(str(directory)).get("vocab_size")
  return None if size is None else int(size)


def load_instruction_data(kwargs: dict[str, Any]):
  """``config.data.name="instructions"``: :func:`fedtree.datasets.instructions.from_instructions` of the
  dataset saved at ``config.data.path`` (refused in one line naming its preparation, ``hub``), tokenized
  with the tokenizer of ``config.data.tokenizer`` (a checkpoint directory) for its model's vocabulary."""
  from fedtree.datasets.instructions import from_instructions, load_dataset_dir

  kwargs = dict(kwargs)
  ds = load_dataset_dir(
    kwargs.pop("path", None), split=kwargs.pop("split", None), hub=kwargs.pop("hub", None)
  )
  directory = kwargs.pop("tokenizer", None)
  tok = tokenizer_of(directory, "config.data.tokenizer")
  vocab = kwargs.pop("vocab_size", None) or vocab_size_of(directory)
  return from_instructions(ds, tok, vocab_size=vocab, **kwargs)


def load_tasks(config: ml_collections.ConfigDict) -> dict[str, tuple[Any, Any]]:
  """``{name: (prepared task, tokenizer)}`` of ``config.tasks`` (``{}`` without one).

  Raises:
    ValueError: an unknown field or kind (named); FileNotFoundError: a missing path or tokenizer.
  """
  from fedtree.datasets.instructions import choice_task, generation_task, load_dataset_dir
  from fedtree.experiment.spec import check_fields

  section = config.get("tasks", None)
  if not section:
    return {}
  out = {}
  default_tok = (config.get("model", {}) or {}).get("checkpoint", None)
  for name, cfg in section.items():
    where = f"config.tasks.{name}"
    cfg = dict(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg)
    check_fields(where, list(cfg), TASK_FIELDS)
    kind = cfg.pop("kind", None)
    if kind not in TASK_KINDS:
      raise ValueError(f"{where}.kind={kind!r}; choose one of {TASK_KINDS}")
    if cfg.get("path", None) is None:  # not prepared: not scored (a path given and missing is refused)
      continue
    tok_dir = cfg.pop("tokenizer", None) or default_tok
    ds = load_dataset_dir(
      cfg.pop("path", None), split=cfg.pop("split", None), hub=cfg.pop("hub", None), where=where
    )
    tok = tokenizer_of(tok_dir, f"{where}.tokenizer")
    cfg = {k: v for k, v in cfg.items() if v is not None}
    if kind == "choice":
      cfg.pop("max_new_tokens", None)
      out[name] = (choice_task(ds, tok, **cfg), tok)
    else:
      out[name] = (generation_task(ds, tok, **cfg), tok)
  return out


def budget_summary(
  label: str, summary: Mapping[str, Any], budget_mb: float | None
) -> tuple[dict[str, Any], str]:
  """``(fields, warning)``: the run's ``communication_MB`` (up and down, every edge, since round 0) and,
  with a budget (FlowerTune's 200,000 MB), ``communication_budget_MB`` and ``over_budget``; ``warning``
  is the line a run over its budget prints (``""`` otherwise)."""
  if "uplink_MB" not in summary:
    return {}, ""
  total = float(summary["uplink_MB"]) + float(summary["downlink_MB"])
  out: dict[str, Any] = {"communication_MB": total}
  if budget_mb is None:
    return out, ""
  over = total > float(budget_mb)
  out.update(communication_budget_MB=float(budget_mb), over_budget=bool(over))
  warning = (
    (
      f"warning: run {label!r} sent {total:,.1f} MB (up and down), over its communication budget of "
      f"{float(budget_mb):,.1f} MB (config.communication_budget_MB)"
    )
    if over
    else ""
  )
  return out, warning


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
