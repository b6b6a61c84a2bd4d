"""Instruction and chat data for fine-tuning a pretrained language model, from Hugging Face ``datasets``.

:func:`from_instructions` turns a ``datasets.Dataset`` of one of :data:`FORMATS` into
:class:`~fedtree.core.data.FederatedData` of next-token sequences: every example a prompt and a
response, rendered by a template (:data:`TEMPLATES`), tokenized with the model's tokenizer, cut to
``seq_len`` tokens and right-padded. ``x`` holds the token ids, ``y`` the next token where it is a
response token and 0 elsewhere (the prompt and the padding are never trained on nor scored:
:func:`fedtree.core.model.token_mask`). Token id 0 is therefore never a target: it is ``<unk>`` in the
Llama, Mistral and TinyLlama vocabularies, but ``!`` in GPT-2's and Qwen2's, whose ``!`` targets are
left out of the loss (their count is reported, ``targets_id0``).

Formats (the columns of the Hub's datasets):

* ``alpaca``: ``instruction``, ``input``, ``output`` (tatsu-lab/alpaca, vicgalle/alpaca-gpt4,
  FinGPT/fingpt-sentiment-train, medalpaca/medical_meadow_medical_flashcards, CodeAlpaca-20k);
* ``aya``: ``inputs``, ``targets`` (and ``user_id``, ``language``: CohereForAI/aya_dataset);
* ``oasst``: OpenAssistant's message rows (``message_id``, ``parent_id``, ``role``, ``text``,
  ``user_id``): every assistant reply with its parent prompt, the reply's author its user (as
  pfl-research pairs them);
* ``messages``: a ``messages`` column of ``[{"role", "content"}, ...]`` conversations (chat logs):
  the last assistant turn the response, the turns before it the prompt.

Templates: ``alpaca`` (Stanford Alpaca's, with and without input), ``flowertune`` (FlowerTune's
Alpaca variant: the input appended to the instruction, ``### Response: ``), ``chat`` (the tokenizer's
chat template, ``apply_chat_template``), ``raw`` (prompt and response each followed by EOS, pfl-research's
Aya and OpenAssistant preprocessing).

Clients (:func:`partition`): ``iid``, ``dirichlet`` over a label column, ``poisson`` (pfl-research's
artificial users: sizes drawn from a Poisson distribution), or one client per value of a natural id
(``client_column="user_id"``), with ``max_per_client`` splitting a power user into several (as
pfl-research splits Aya's) and ``min_per_client`` dropping the smallest.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedtree.core.data import (
  FederatedData,
  from_client_arrays,
  partition_by_id,
  partition_dirichlet,
  partition_iid,
)
from fedtree.datasets.columns import dense_codes

FORMATS = ("alpaca", "aya", "oasst", "messages")
TEMPLATES = ("alpaca", "flowertune", "chat", "raw")
PARTITIONERS = ("iid", "dirichlet", "poisson")
USE_INPUT = ("keep", "drop", "as_instruction")
"""What an ``alpaca`` row's ``input`` becomes: ``keep`` (the template renders it: Alpaca's own section,
FlowerTune's appended to the instruction after a space, as its finance and code challenges do),
``drop`` (FlowerTune's general NLP challenge trains on the instruction alone), ``as_instruction`` (its
medical challenge: the flashcard's question, the ``input``, replaces the constant ``instruction``)."""
_COLUMNS = {
  "alpaca": ("instruction", "output"),
  "aya": ("inputs", "targets"),
  "oasst": ("message_id", "parent_id", "role", "text"),
  "messages": ("messages",),
}

ALPACA = (
  "Below is an instruction that describes a task, paired with an input that provides further context. "
  "Write a response that appropriately completes the request.\n\n"
  "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
)
ALPACA_NO_INPUT = (
  "Below is an instruction that describes a task. Write a response that appropriately "
  "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:"
)
FLOWERTUNE = (
  "Below is an instruction that describes a task. Write a response that appropriately completes "
  "the request.\n### Instruction:\n{instruction}\n### Response: "
)


@dataclasses.dataclass(frozen=True)
class Pair:
  """One example: what the model is given and what it learns to answer.

  Attributes:
    instruction: the task (or the whole prompt).
    input: its context ("" for none).
    response: the answer trained on.
    history: earlier turns ``[{"role", "content"}]`` of a conversation (``messages`` format).
  """

  instruction: str
  input: str
  response: str
  history: tuple = ()


def pairs(ds, fmt: str, use_input: str = "keep") -> tuple[list[Pair], np.ndarray]:
  """``(pairs, rows)`` of a dataset in format ``fmt``: every example and the dataset row its client
  column is read from (OpenAssistant: the reply's row); ``use_input``: :data:`USE_INPUT`.

  Raises:
    ValueError: an unknown format or ``use_input``, or a column the format needs missing (listing the
      dataset's).
  """
  if fmt not in FORMATS:
    raise ValueError(f"instruction format={fmt!r}; choose one of {FORMATS}")
  if use_input not in USE_INPUT:
    raise ValueError(f"use_input={use_input!r}; choose one of {USE_INPUT}")
  missing = [c for c in _COLUMNS[fmt] if c not in ds.column_names]
  if missing:
    raise ValueError(f"format {fmt!r} needs column(s) {missing}; the dataset has {ds.column_names}")
  if fmt == "alpaca":
    inputs = ds["input"] if "input" in ds.column_names else [""] * len(ds)
    out = []
    for i, x, o in zip(ds["instruction"], inputs, ds["output"], strict=True):
      i, x = str(i), str(x or "")
      i, x = {"keep": (i, x), "drop": (i, ""), "as_instruction": (x, "")}[use_input]
      out.append(Pair(i, x, str(o)))
    return out, np.arange(len(ds))
  if fmt == "aya":
    return [Pair(str(i), "", str(t)) for i, t in zip(ds["inputs"], ds["targets"], strict=True)], np.arange(
      len(ds)
    )
  if fmt == "oasst":
    text = {m: t for m, t, r in zip(ds["message_id"], ds["text"], ds["role"], strict=True) if r == "prompter"}
    out, rows = [], []
    for i, (parent, role, reply) in enumerate(zip(ds["parent_id"], ds["role"], ds["text"], strict=True)):
      if role == "assistant" and parent in text:
        out.append(Pair(str(text[parent]), "", str(reply)))
        rows.append(i)
    return out, np.asarray(rows, np.int64)
  out, rows = [], []
  for i, conv in enumerate(ds["messages"]):
    turns = list(conv)
    last = max((j for j, t in enumerate(turns) if t["role"] == "assistant"), default=None)
    if last is None or last == 0:
      continue
    prior = tuple({"role": t["role"], "content": str(t["content"])} for t in turns[:last])
    out.append(Pair(prior[-1]["content"], "", str(turns[last]["content"]), history=prior))
    rows.append(i)
  return out, np.asarray(rows, np.int64)


# ------------------------------------------------------------------------ rendering and tokens
def _ids(tokenizer, text: str, special: bool) -> list[int]:
  if hasattr(tokenizer, "encode") and not hasattr(tokenizer, "apply_chat_template"):  # tokenizers.Tokenizer
    return list(tokenizer.encode(text, add_special_tokens=special).ids)
  return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def eos_id(tokenizer) -> int:
  """The tokenizer's end-of-sequence id.

  Raises:
    ValueError: a tokenizer without one (the response would never end).
  """
  eos = getattr(tokenizer, "eos_token_id", None)
  if eos is None:
    raise ValueError("the tokenizer has no eos_token_id; save it with an eos_token (responses must end)")
  return int(eos)


def prompt_ids(tokenizer, pair: Pair, template: str) -> list[int]:
  """The token ids of ``pair``'s prompt rendered by ``template`` (:data:`TEMPLATES`)."""
  if template not in TEMPLATES:
    raise ValueError(f"template={template!r}; choose one of {TEMPLATES}")
  if template == "raw":
    return _ids(tokenizer, pair.instruction + (f"\n{pair.input}" if pair.input else ""), False) + [
      eos_id(tokenizer)
    ]
  if template == "chat":
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError(
        "template='chat' needs a tokenizer with a chat_template (tokenizer_config.json); choose "
        f"one of {TEMPLATES} else"
      )
    user = pair.instruction + (f"\n\n{pair.input}" if pair.input else "")
    turns = list(pair.history) or [{"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return _ids(tokenizer, text, False)
  if template == "flowertune":
    instruction = pair.instruction + (f" {pair.input}" if pair.input else "")
    return _ids(tokenizer, FLOWERTUNE.format(instruction=instruction), True)
  fmt = ALPACA if pair.input else ALPACA_NO_INPUT
  return _ids(tokenizer, fmt.format(instruction=pair.instruction, input=pair.input), True)


def response_ids(tokenizer, pair: Pair) -> list[int]:
  """The response's token ids, EOS at the end."""
  return _ids(tokenizer, pair.response, False) + [eos_id(tokenizer)]


def encode(
  prompt: Sequence[int], response: Sequence[int], seq_len: int
) -> tuple[np.ndarray, np.ndarray, int]:
  """``(x int32[seq_len], y int32[seq_len], trained tokens)`` of one example: the prompt then the
  response, cut to ``seq_len + 1`` tokens; ``y[t]`` is token ``t + 1`` where it is a response token,
  else 0. Padding (after the sequence) is token 0 in ``x``: causal attention never lets a real
  position see it."""
  ids = (list(prompt) + list(response))[: seq_len + 1]
  x = np.zeros(seq_len, np.int32)
  y = np.zeros(seq_len, np.int32)
  n = len(ids) - 1
  x[:n] = ids[:n]
  y[:n] = ids[1:]
  y[: max(len(prompt) - 1, 0)] = 0
  return x, y, max(n - max(len(prompt) - 1, 0), 0)


# ------------------------------------------------------------------------ clients
def partition(
  n: int,
  *,
  partitioner: str | None,
  partitioner_args: dict[str, Any] | None,
  ids: np.ndarray | None,
  labels: np.ndarray | None,
  rng: np.random.Generator,
) -> list[np.ndarray]:
  """The example indices of every client: a partitioner (:data:`PARTITIONERS`) or one client per value
  of ``ids`` (a natural id)."""
  args = dict(partitioner_args or {})
  if partitioner is None:
    if ids is None:
      raise ValueError(f"instructions need a partitioner ({PARTITIONERS}) or a client_column (a natural id)")
    parts, _ = partition_by_id(dense_codes(ids)[0])
    return [np.asarray(p, np.int64) for p in parts]
  if partitioner not in PARTITIONERS:
    raise ValueError(f"partitioner={partitioner!r}; choose one of {PARTITIONERS} or None (a client_column)")
  allowed = {
    "iid": ("num_clients",),
    "dirichlet": ("num_clients", "alpha", "min_size"),
    "poisson": ("mean",),
  }[partitioner]
  if (
    sorted(set(args) - set(allowed))
    or (partitioner != "poisson" and "num_clients" not in args)
    or (partitioner == "poisson" and "mean" not in args)
  ):
    raise ValueError(
      f"partitioner={partitioner!r} takes partitioner_args {allowed} (the first required); got {sorted(args)}"
    )
  if partitioner == "iid":
    return partition_iid(n, int(args["num_clients"]), rng)
  if partitioner == "dirichlet":
    if labels is None:
      raise ValueError(
        "partitioner='dirichlet' needs label_column (a categorical column: language, category)"
      )
    return partition_dirichlet(
      dense_codes(labels)[0],
      int(args["num_clients"]),
      float(args.get("alpha", 0.5)),
      rng,
      min_size=int(args.get("min_size", 1)),
    )
  order = rng.permutation(n)
  out, start = [], 0
  while start < n:
    size = max(1, int(rng.poisson(float(args["mean"]))))
    out.append(np.sort(order[start : start + size]))
    start += size
  return out


def split_users(parts: list[np.ndarray], max_per_client: int | None, min_per_client: int) -> list[np.ndarray]:
  """``parts`` with every client above ``max_per_client`` examples split into consecutive clients of
  that many (pfl-research's power users) and those below ``min_per_client`` dropped."""
  out = []
  for p in parts:
    chunks = (
      [p]
      if not max_per_client
      else [p[i : i + int(max_per_client)] for i in range(0, len(p), int(max_per_client))]
    )
    out += [c for c in chunks if len(c) >= max(int(min_per_client), 1)]
  return out


@dataclasses.dataclass(frozen=True)
class Stats:
  """What the tokenization kept: ``examples`` encoded, ``dropped`` (nothing of the response left within
  ``seq_len``), ``truncated`` (cut), ``trained_tokens`` (response tokens), ``targets_id0`` (response
  tokens equal to id 0, left out: see the module docstring)."""

  examples: int
  dropped: int
  truncated: int
  trained_tokens: int
  targets_id0: int


def tokenize(
  pairs_: Sequence[Pair], tokenizer, *, template: str, seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Stats]:
  """``(x int32[N, T], y int32[N, T], kept int[N'] indices of the pairs kept, Stats)``."""
  xs, ys, kept = [], [], []
  dropped = truncated = trained = zero = 0
  for i, p in enumerate(pairs_):
    pr, rs = prompt_ids(tokenizer, p, template), response_ids(tokenizer, p)
    x, y, n = encode(pr, rs, seq_len)
    if n == 0:
      dropped += 1
      continue
    truncated += len(pr) + len(rs) > seq_len + 1
    lost = sum(1 for t in rs[: max(seq_len + 1 - len(pr), 0)] if t == 0)
    zero += lost
    trained += n - lost
    xs.append(x)
    ys.append(y)
    kept.append(i)
  if not xs:
    raise ValueError(
      f"no example keeps a response token within seq_len={seq_len} ({len(pairs_)} examples); raise seq_len"
    )
  return (
    np.stack(xs),
    np.stack(ys),
    np.asarray(kept, np.int64),
    Stats(len(xs), dropped, truncated, trained, zero),
  )


def from_instructions(
  train,
  tokenizer,
  *,
  format: str = "alpaca",
  template: str = "alpaca",
  seq_len: int = 512,
  partitioner: str | None = "iid",
  partitioner_args: dict[str, Any] | None = None,
  client_column: str | None = None,
  label_column: str | None = None,
  max_per_client: int | None = None,
  min_per_client: int = 1,
  test_fraction: float = 0.1,
  max_examples: int | None = None,
  seed: int = 0,
  vocab_size: int | None = None,
  use_input: str = "keep",
) -> tuple[FederatedData, np.ndarray, None, dict[str, Any]]:
  """Federated next-token data of an instruction or chat dataset (see the module docstring).

  Args:
    train: a ``datasets.Dataset`` in ``format``.
    tokenizer: the model's tokenizer (``transformers``; :func:`fedtree.models.load_tokenizer`).
    format: one of :data:`FORMATS`.
    template: one of :data:`TEMPLATES`.
    seq_len: tokens per example ``T``.
    partitioner: one of :data:`PARTITIONERS`, or ``None`` with ``client_column`` (a natural id).
    partitioner_args: ``num_clients`` (``iid``, ``dirichlet``), ``alpha`` (``dirichlet``), ``mean``
      (``poisson``).
    client_column: one client per value (``user_id``), with ``partitioner=None``.
    label_column: the categorical column ``dirichlet`` splits by (``language``).
    max_per_client: split a client with more examples into several of this many.
    min_per_client: drop clients with fewer examples.
    test_fraction: share of every client's examples held out for its test split (rounded down).
    max_examples: use the first that many examples of the dataset (``None``: all).
    seed: the partition and the train/test split.
    vocab_size: the model's vocabulary (``num_classes``; default the tokenizer's length).
    use_input: what an ``alpaca`` row's ``input`` becomes (:data:`USE_INPUT`).

  Returns:
    ``(data, groups int32[C] (zeros), None, extras)``; ``extras``: ``client_names`` (natural ids),
    ``stats`` (:class:`Stats`).

  Raises:
    ValueError: an unknown format, template or partitioner, a missing column, a token id outside the
      vocabulary, a client without examples.

  Example:
    >>> import datasets
    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> from transformers import PreTrainedTokenizerFast
    >>> words = ["<unk>", "<s>", "</s>", "<pad>", "Say", "hi", "###", "Instruction:", "Response:"]
    >>> tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    >>> tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    >>> tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
    ...                                     unk_token="<unk>", pad_token="<pad>")
    >>> ds = datasets.Dataset.from_dict({"instruction": ["Say hi"] * 8, "input": [""] * 8,
    ...                                  "output": ["hi"] * 8})
    >>> data, *_ = from_instructions(ds, tokenizer, seq_len=64,
    ...                              partitioner_args={"num_clients": 2})
    >>> data.num_clients
    2
  """
  if max_examples is not None:
    train = train.select(range(min(int(max_examples), len(train))))
  rng = np.random.default_rng(seed)
  items, rows = pairs(train, format, use_input)
  for col in (client_column, label_column):
    if col is not None and col not in train.column_names:
      raise ValueError(f"column {col!r} is not in the dataset; it has {train.column_names}")
  x, y, kept, stats = tokenize(items, tokenizer, template=template, seq_len=int(seq_len))
  rows = rows[kept]
  ids = None if client_column is None else np.asarray(train[client_column], dtype=object)[rows].astype(str)
  labels = None if label_column is None else np.asarray(train[label_column], dtype=object)[rows].astype(str)
  parts = partition(
    len(x), partitioner=partitioner, partitioner_args=partitioner_args, ids=ids, labels=labels, rng=rng
  )
  names = None
  if partitioner is None and ids is not None:
    names = [str(ids[p[0]]) for p in parts]
  split = split_users(parts, max_per_client, min_per_client)
  if names is not None:
    counter: dict[str, int] = {}
    named = []
    for p in split:
      base = str(ids[p[0]])
      k = counter.get(base, 0)
      counter[base] = k + 1
      named.append(base if k == 0 else f"{base}-{k}")
    names = named
  if not split:
    raise ValueError(f"no client keeps min_per_client={min_per_client} examples")
  vocab = int(vocab_size if vocab_size is not None else len(tokenizer))
  top = int(max(x.max(), y.max()))
  if top >= vocab:
    raise ValueError(
      f"token id {top} is outside the model's vocabulary of {vocab}; tokenize with the model's own tokenizer"
    )
  tr, te = [], []
  for p in split:
    p = p[rng.permutation(len(p))]
    k = int(np.floor(float(test_fraction) * len(p))) if len(p) > 1 else 0
    tr.append((x[p[k:]], y[p[k:]]))
    te.append((x[p[:k]], y[p[:k]]))
  data = from_client_arrays(tr, te, num_classes=vocab, dtype=np.int32)
  extras: dict[str, Any] = {"stats": stats}
  if names is not None:
    extras["client_names"] = tuple(names)
  return data, np.zeros(data.num_clients, np.int32), None, extras


def load_dataset_dir(
  path: str, *, split: str | None = None, hub: str | None = None, where: str = "config.data"
):
  """The ``datasets.Dataset`` saved at ``path`` (``save_to_disk``; a ``DatasetDict``: its ``split``).

  Raises:
    FileNotFoundError: ``path`` missing or not a saved dataset, in one line naming the preparation
      (``hub``: the Hub dataset to save there, where the Hub is reachable).
  """
  import datasets

  how = (
    f'; prepare it where the Hub is reachable: python -c "import datasets; datasets.load_dataset('
    f"{hub}).save_to_disk('{path}')\""
    if hub
    else "; write it with Dataset.save_to_disk"
  )
  if not path or not os.path.exists(path):
    raise FileNotFoundError(f"{where}.path={path!r} does not exist{how}")
  try:
    loaded = datasets.load_from_disk(path)
  except FileNotFoundError as e:
    raise FileNotFoundError(
      f"{where}.path={path!r} holds no dataset written by save_to_disk ({e}){how}"
    ) from e
  if isinstance(loaded, datasets.DatasetDict):
    if split is None or split not in loaded:
      raise ValueError(
        f"{where}.path={path!r} is a DatasetDict with splits {sorted(loaded)}; set {where}.split"
      )
    return loaded[split]
  return loaded


def load_instructions(
  *, path: str, tokenizer, hub: str | None = None, split: str | None = None, **kwargs
) -> tuple[FederatedData, np.ndarray, None, dict[str, Any]]:
  """:func:`from_instructions` of the dataset saved at ``path`` (:func:`load_dataset_dir`)."""
  return from_instructions(load_dataset_dir(path, split=split, hub=hub), tokenizer, **kwargs)


# ------------------------------------------------------------------------ evaluation tasks
CHOICE_FORMATS = ("mmlu", "medmcqa", "medqa")
GENERATION_FORMATS = ("alpaca",)
LETTERS = "ABCDEFGHIJ"


@dataclasses.dataclass(frozen=True)
class ChoiceTask:
  """A multiple-choice benchmark, tokenized (:func:`choice_task`).

  Attributes:
    tokens: ``int32[N * K, T]`` every question followed by each of its ``K`` choices.
    labels: ``int32[N * K, T]`` the choice's tokens as next-token targets, 0 elsewhere.
    answer: ``int32[N]`` the right choice.
    num_choices: ``K``.
  """

  tokens: np.ndarray
  labels: np.ndarray
  answer: np.ndarray
  num_choices: int


@dataclasses.dataclass(frozen=True)
class GenerationTask:
  """A benchmark scored by greedy generation (:func:`generation_task`).

  Attributes:
    prompts: ``int32[N, T]`` every prompt, right-padded, ``T`` leaving room for the answer.
    lengths: ``int32[N]`` the prompts' lengths.
    references: the expected answers.
    max_new_tokens: tokens generated per prompt.
    eos: the tokenizer's end-of-sequence id (generation stops there).
  """

  prompts: np.ndarray
  lengths: np.ndarray
  references: tuple[str, ...]
  max_new_tokens: int
  eos: int


def mmlu_prompt(question: str, choices: Sequence[str], subject: str | None = None) -> str:
  """MMLU's zero-shot prompt (Hendrycks et al. 2021): the question, its lettered choices, ``Answer:``."""
  head = (
    f"The following is a multiple choice question about {subject.replace('_', ' ')}.\n\n" if subject else ""
  )
  lines = "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(choices))
  return f"{head}{question}{lines}\nAnswer:"


def _choice_rows(ds, fmt: str) -> list[tuple[str, list[str], int]]:
  if fmt not in CHOICE_FORMATS:
    raise ValueError(f"choice format={fmt!r}; choose one of {CHOICE_FORMATS}")
  need = {
    "mmlu": ("question", "choices", "answer"),
    "medmcqa": ("question", "opa", "opb", "opc", "opd", "cop"),
    "medqa": ("question", "options", "answer_idx"),
  }
  missing = [c for c in need[fmt] if c not in ds.column_names]
  if missing:
    raise ValueError(f"choice format {fmt!r} needs column(s) {missing}; the dataset has {ds.column_names}")
  out = []
  for row in ds:
    if fmt == "mmlu":
      choices = [str(c) for c in row["choices"]]
      out.append(
        (mmlu_prompt(str(row["question"]), choices, row.get("subject")), choices, int(row["answer"]))
      )
    elif fmt == "medmcqa":
      choices = [str(row[k]) for k in ("opa", "opb", "opc", "opd")]
      out.append((mmlu_prompt(str(row["question"]), choices), choices, int(row["cop"])))
    else:  # MedQA (4 options): options {letter: text}, answer_idx the letter
      letters = sorted(row["options"])
      choices = [str(row["options"][k]) for k in letters]
      out.append((mmlu_prompt(str(row["question"]), choices), choices, letters.index(str(row["answer_idx"]))))
  return out


def choice_task(
  ds, tokenizer, *, format: str = "mmlu", template: str = "raw", seq_len: int = 512, limit: int | None = None
) -> ChoiceTask:
  """A multiple-choice benchmark scored by log-likelihood: every question's prompt (rendered by
  ``template``; ``raw``: the MMLU prompt as it is, after the tokenizer's BOS) followed by each choice's
  letter (`` A``, `` B``, ...); the model's choice is the letter of highest log-likelihood.

  Raises:
    ValueError: an unknown format, missing columns, a prompt longer than ``seq_len``.
  """
  rows = _choice_rows(ds, format)[:limit]
  k = max(len(c) for _, c, _ in rows)
  tokens, labels = [], []
  for prompt, choices, _ in rows:
    if len(choices) != k:
      raise ValueError(f"every question needs {k} choices; one has {len(choices)}")
    p = Pair(prompt, "", "")
    pr = _ids(tokenizer, prompt, True) if template == "raw" else prompt_ids(tokenizer, p, template)
    for j in range(k):
      cont = _ids(tokenizer, f" {LETTERS[j]}", False)
      if len(pr) + len(cont) > seq_len + 1:
        raise ValueError(
          f"a question of {len(pr)} tokens does not fit seq_len={seq_len}; raise it or use limit"
        )
      x, y, _ = encode(pr, cont, seq_len)
      tokens.append(x)
      labels.append(y)
  return ChoiceTask(np.stack(tokens), np.stack(labels), np.asarray([a for *_, a in rows], np.int32), k)


def generation_task(
  ds,
  tokenizer,
  *,
  format: str = "alpaca",
  template: str = "alpaca",
  seq_len: int = 512,
  max_new_tokens: int = 8,
  limit: int | None = None,
) -> GenerationTask:
  """A benchmark scored by greedy generation: every example's prompt (``template``) and its expected
  response (``output``), for exact match (FinGPT's sentiment tests FPB, FiQA, TFNS in their
  instruction form; PubMedQA's yes/no/maybe).

  Raises:
    ValueError: an unknown format, missing columns, a prompt that leaves no room for
      ``max_new_tokens`` in ``seq_len``.
  """
  if format not in GENERATION_FORMATS:
    raise ValueError(f"generation format={format!r}; choose one of {GENERATION_FORMATS}")
  items, _ = pairs(ds, format)
  items = items[:limit]
  prompts = np.zeros((len(items), seq_len), np.int32)
  lengths = np.zeros(len(items), np.int32)
  for i, p in enumerate(items):
    pr = prompt_ids(tokenizer, p, template)
    if len(pr) + max_new_tokens > seq_len:
      raise ValueError(
        f"a prompt of {len(pr)} tokens leaves no room for {max_new_tokens} new tokens in "
        f"seq_len={seq_len}; raise seq_len"
      )
    prompts[i, : len(pr)] = pr
    lengths[i] = len(pr)
  return GenerationTask(
    prompts, lengths, tuple(p.response for p in items), int(max_new_tokens), eos_id(tokenizer)
  )
