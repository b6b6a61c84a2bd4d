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
