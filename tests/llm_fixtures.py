"""Tiny checkpoints, tokenizers and mock rows of the real schemas for the language-model tests (issue 50).

Nothing is downloaded: the tokenizer is a byte-pair encoding trained here on the mock rows, the model a
random ``LlamaForCausalLM`` saved with ``save_pretrained``, the rows in-memory ``datasets.Dataset``s with
the columns of the Hub's datasets (alpaca-gpt4, fingpt-sentiment, medical flashcards, CodeAlpaca, Aya,
OpenAssistant, MMLU, MedMCQA, chat logs).
"""

import os

import numpy as np

CHAT_TEMPLATE = (
  "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
  "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SENTIMENTS = ("negative", "neutral", "positive")
WORDS = (
  "the market rose sharply after the report profits fell shares dropped revenue grew interest rates "
  "patients doctor dose symptoms treatment code function returns list sort value python print "
  "translate hello world answer question which of the following is true false yes no maybe"
).split()


def _sentence(rng, n):
  return " ".join(rng.choice(WORDS, n))


def alpaca_rows(n=24, seed=0):
  """alpaca-gpt4 / fingpt-sentiment / medical flashcards / CodeAlpaca: instruction, input, output."""
  rng = np.random.default_rng(seed)
  return {
    "instruction": [f"What is the sentiment of this news? {_sentence(rng, 3)}" for _ in range(n)],
    "input": ["" if i % 3 == 0 else _sentence(rng, 5) for i in range(n)],
    "output": [SENTIMENTS[i % 3] if i % 2 else _sentence(rng, 6) for i in range(n)],
  }


def aya_rows(n=30, seed=1):
  """CohereForAI/aya_dataset: inputs, targets, language, language_code, annotation_type, user_id."""
  rng = np.random.default_rng(seed)
  users = [f"u{int(u)}" for u in rng.integers(0, 4, n)]
  langs = ["English", "French", "Swahili"]
  return {
    "inputs": [_sentence(rng, 6) for _ in range(n)],
    "targets": [_sentence(rng, 5) for _ in range(n)],
    "language": [langs[i % 3] for i in range(n)],
    "language_code": [langs[i % 3][:3].lower() for i in range(n)],
    "annotation_type": ["original-annotations"] * n,
    "user_id": users,
  }


def oasst_rows(trees=6, seed=2):
  """OpenAssistant/oasst2 message rows: each tree a prompt, two assistant replies, one follow-up."""
  rng = np.random.default_rng(seed)
  rows = {k: [] for k in ("message_id", "parent_id", "user_id", "text", "role", "lang", "message_tree_id")}

  def add(mid, parent, user, role, tree):
    for k, v in (
      ("message_id", mid),
      ("parent_id", parent),
      ("user_id", user),
      ("text", _sentence(rng, 5)),
      ("role", role),
      ("lang", "en"),
      ("message_tree_id", tree),
    ):
      rows[k].append(v)

  for t in range(trees):
    root = f"m{t}"
    add(root, None, f"p{t % 2}", "prompter", root)
    add(f"{root}a", root, f"a{t % 3}", "assistant", root)
    add(f"{root}b", root, f"a{(t + 1) % 3}", "assistant", root)
    add(f"{root}c", f"{root}a", f"p{t % 2}", "prompter", root)  # a follow-up, no reply: not a pair
  return rows


def messages_rows(n=8, seed=3):
  """Chat logs (Fed-ChatbotIT / WildChat style): a messages column of role/content turns, a user id."""
  rng = np.random.default_rng(seed)
  convs = []
  for i in range(n):
    turns = [
      {"role": "user", "content": _sentence(rng, 4)},
      {"role": "assistant", "content": _sentence(rng, 4)},
    ]
    if i % 2:
      turns += [
        {"role": "user", "content": _sentence(rng, 3)},
        {"role": "assistant", "content": _sentence(rng, 3)},
      ]
    convs.append(turns)
  return {"messages": convs, "user_id": [f"c{i % 3}" for i in range(n)]}


def mmlu_rows(n=6, seed=4):
  """cais/mmlu: question, subject, choices (4), answer (0-3)."""
  rng = np.random.default_rng(seed)
  return {
    "question": [_sentence(rng, 5) + "?" for _ in range(n)],
    "subject": ["high_school_biology"] * n,
    "choices": [[_sentence(rng, 2) for _ in range(4)] for _ in range(n)],
    "answer": [int(a) for a in rng.integers(0, 4, n)],
  }


def medmcqa_rows(n=5, seed=5):
  """openlifescienceai/medmcqa: question, opa, opb, opc, opd, cop (0-3)."""
  rng = np.random.default_rng(seed)
  return {
    "question": [_sentence(rng, 5) for _ in range(n)],
    **{k: [_sentence(rng, 2) for _ in range(n)] for k in ("opa", "opb", "opc", "opd")},
    "cop": [int(a) for a in rng.integers(0, 4, n)],
  }


def corpus():
  rng = np.random.default_rng(9)
  from fedtree.datasets.instructions import ALPACA, FLOWERTUNE

  lines = [
    ALPACA,
    FLOWERTUNE,
    "The following is a multiple choice question about biology. A. B. C. D. Answer:",
  ] * 60
  lines += [" ".join(WORDS)] + [_sentence(rng, 8) for _ in range(200)]
  lines += ["<|user|>", "<|assistant|>", "<|system|>"] + list(SENTIMENTS)
  return lines


def tiny_tokenizer(directory: str, vocab_size: int = 420):
  """A byte-pair tokenizer trained on the fixtures' words (ids: 0 <unk>, 1 <s>, 2 </s>, 3 <pad>), with
  a chat template, saved as a ``transformers`` fast tokenizer in ``directory``."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(corpus(), trainer)
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
  fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
  )
  fast.chat_template = CHAT_TEMPLATE
  fast.save_pretrained(directory)
  return fast


def tiny_checkpoint(directory: str, *, layers: int = 2, hidden: int = 32, seed: int = 0):
  """A random Llama (GQA, 4 heads over 2) with the tiny tokenizer, saved in ``directory``; returns its
  tokenizer."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM

  os.makedirs(directory, exist_ok=True)
  tok = tiny_tokenizer(directory)
  torch.manual_seed(seed)
  config = LlamaConfig(
    vocab_size=len(tok),
    hidden_size=hidden,
    intermediate_size=2 * hidden,
    num_hidden_layers=layers,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=3,
  )
  LlamaForCausalLM(config).save_pretrained(directory)
  return tok


def save(rows: dict, directory: str):
  """``rows`` as a ``datasets.Dataset`` written by ``save_to_disk`` (what a preparation step leaves)."""
  import datasets

  datasets.Dataset.from_dict(rows).save_to_disk(directory)
  return directory
