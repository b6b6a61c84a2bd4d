"""Instruction and chat data, partitions and language-model benchmarks (issue 50, priority 4), each on
mock rows of the real schema (in-memory ``datasets.Dataset``) and a tiny tokenizer trained here; the
benchmark scores are checked against transformers' own log-likelihoods and greedy generation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[llm]')")
torch = pytest.importorskip("torch")

import llm_fixtures as F  # noqa: E402

from fedtree.datasets import instructions as I  # noqa: E402
from fedtree.evaluation import llm as E  # noqa: E402
from fedtree.models import load_pretrained  # noqa: E402

SEQ = 128


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tiny_llama"))
  tok = F.tiny_checkpoint(path)
  return path, tok


def _ds(rows):
  return datasets.Dataset.from_dict(rows)


def test_formats_read_the_hub_schemas():
  """alpaca (with and without input), Aya, OpenAssistant (every assistant reply with its parent prompt;
  a prompt without a reply is no pair; the reply's author is the user), chat logs (the last assistant
  turn is the response, the turns before it the history)."""
  pairs, rows = I.pairs(_ds(F.alpaca_rows(6)), "alpaca")
  assert len(pairs) == 6 and pairs[0].input == "" and pairs[1].input != "" and list(rows) == list(range(6))
  aya = F.aya_rows(5)
  pairs, _ = I.pairs(_ds(aya), "aya")
  assert [p.response for p in pairs] == aya["targets"] and [p.instruction for p in pairs] == aya["inputs"]
  o = F.oasst_rows(trees=3)
  pairs, rows = I.pairs(_ds(o), "oasst")
  assert len(pairs) == 6  # two replies per tree, the follow-up unanswered
  for p, r in zip(pairs, rows, strict=True):
    assert o["role"][r] == "assistant" and p.response == o["text"][r]
    assert p.instruction == o["text"][o["message_id"].index(o["parent_id"][r])]
  m = F.messages_rows(4)
  pairs, _ = I.pairs(_ds(m), "messages")
  assert pairs[1].response == m["messages"][1][3]["content"] and len(pairs[1].history) == 3
  with pytest.raises(
    ValueError,
    match=r"format 'aya' needs column\(s\) \['inputs', 'targets'\]; the dataset "
    r"has \['instruction', 'input', 'output'\]",
  ):
    I.pairs(_ds(F.alpaca_rows(2)), "aya")
  with pytest.raises(ValueError, match=r"instruction format='dolly'; choose one of"):
    I.pairs(_ds(F.alpaca_rows(2)), "dolly")


def test_templates_and_labels(checkpoint):
  """Each template renders the prompt as its source does (Stanford Alpaca's two forms, FlowerTune's,
  the tokenizer's chat template, raw text + EOS); the labels are the response tokens and EOS, the
  prompt and the padding 0; a cut sequence keeps what fits."""
  _, tok = checkpoint
  with_input, no_input = I.Pair("Sort the list", "3 1 2", "1 2 3"), I.Pair("Say yes", "", "yes")
  assert tok.decode(I.prompt_ids(tok, with_input, "alpaca"), skip_special_tokens=True) == I.ALPACA.format(
    instruction="Sort the list", input="3 1 2"
  )
  assert tok.decode(
    I.prompt_ids(tok, no_input, "alpaca"), skip_special_tokens=True
  ) == I.ALPACA_NO_INPUT.format(instruction="Say yes")
  assert tok.decode(
    I.prompt_ids(tok, with_input, "flowertune"), skip_special_tokens=True
  ) == I.FLOWERTUNE.format(instruction="Sort the list 3 1 2")
  chat = tok.apply_chat_template(
    [{"role": "user", "content": "Sort the list\n\n3 1 2"}], tokenize=False, add_generation_prompt=True
  )
  assert I.prompt_ids(tok, with_input, "chat") == tok(chat, add_special_tokens=False)["input_ids"]
  raw = I.prompt_ids(tok, no_input, "raw")
  assert raw[-1] == tok.eos_token_id and tok.decode(raw[:-1]) == "Say yes"
  prompt, response = I.prompt_ids(tok, no_input, "alpaca"), I.response_ids(tok, no_input)
  assert prompt[0] == tok.bos_token_id and response[-1] == tok.eos_token_id
  x, y, n = I.encode(prompt, response, SEQ)
  ids = prompt + response
  assert n == len(response) and list(x[: len(ids) - 1]) == ids[:-1]
  assert list(y[len(prompt) - 1 : len(ids) - 1]) == response  # what is trained: the response and EOS
  assert not y[: len(prompt) - 1].any() and not y[len(ids) - 1 :].any() and not x[len(ids) - 1 :].any()
  x, y, n = I.encode(prompt, response, len(prompt) + 1)  # room for 2 response tokens
  assert n == 2 and list(y[-2:]) == response[:2]
  assert I.encode(prompt, response, len(prompt) - 1)[2] == 0  # nothing of the response fits
  with pytest.raises(ValueError, match=r"template='chat' needs a tokenizer with a chat_template"):
    I.prompt_ids(type("T", (), {"chat_template": None})(), no_input, "chat")


def test_partitions_iid_dirichlet_poisson_and_natural_users(checkpoint):
  """IID and Dirichlet (by language) cover every example once; Poisson sizes average their mean; one
  client per Aya user (named by it), a power user split by max_per_client, small ones dropped by
  min_per_client; every client holds out its test share; token ids within the vocabulary."""
  _, tok = checkpoint
  aya = _ds(F.aya_rows(30))
  common = dict(format="aya", template="raw", seq_len=SEQ)
  data, groups, central, ex = I.from_instructions(
    aya, tok, partitioner="iid", partitioner_args={"num_clients": 4}, test_fraction=0.25, **common
  )
  assert data.num_clients == 4 and int(data.n_train.sum() + data.n_test.sum()) == 30 and central is None
  assert data.x_train.dtype == np.int32 and data.x_train.shape[-1] == SEQ and data.num_classes == len(tok)
  assert ex["stats"].examples == 30 and ex["stats"].trained_tokens > 30
  data, *_ = I.from_instructions(
    aya,
    tok,
    partitioner="dirichlet",
    label_column="language",
    partitioner_args={"num_clients": 3, "alpha": 0.3},
    test_fraction=0.0,
    **common,
  )
  assert int(data.n_train.sum()) == 30
  rng = np.random.default_rng(0)
  sizes = [
    len(p)
    for p in I.partition(
      4000, partitioner="poisson", partitioner_args={"mean": 16}, ids=None, labels=None, rng=rng
    )
  ]
  assert sum(sizes) == 4000 and abs(np.mean(sizes) - 16) < 4 * 4 / np.sqrt(len(sizes)) + 0.5
  users = F.aya_rows(30)["user_id"]
  data, _, _, ex = I.from_instructions(
    aya, tok, partitioner=None, client_column="user_id", test_fraction=0.0, **common
  )
  counts = {u: users.count(u) for u in sorted(set(users))}
  assert dict(zip(ex["client_names"], data.n_train.tolist(), strict=True)) == counts
  big = max(counts.values())
  data, _, _, ex = I.from_instructions(
    aya, tok, partitioner=None, client_column="user_id", test_fraction=0.0, max_per_client=big - 1, **common
  )
  assert max(data.n_train.tolist()) == big - 1 and int(data.n_train.sum()) == 30
  assert any(n.endswith("-1") for n in ex["client_names"])
  data, *_ = I.from_instructions(
    aya,
    tok,
    partitioner=None,
    client_column="user_id",
    test_fraction=0.0,
    min_per_client=min(counts.values()) + 1,
    **common,
  )
  assert data.num_clients == sum(v > min(counts.values()) for v in counts.values())
  with pytest.raises(ValueError, match=r"token id \d+ is outside the model's vocabulary of 10"):
    I.from_instructions(aya, tok, partitioner_args={"num_clients": 2}, vocab_size=10, **common)
  with pytest.raises(
    ValueError, match=r"partitioner='shards'; choose one of \('iid', 'dirichlet', 'poisson'\)"
  ):
    I.from_instructions(aya, tok, partitioner="shards", **common)
  with pytest.raises(ValueError, match=r"column 'writer' is not in the dataset"):
    I.from_instructions(aya, tok, partitioner=None, client_column="writer", **common)


def test_every_format_and_template_tokenizes(checkpoint):
  _, tok = checkpoint
  cases = [
    ("alpaca", F.alpaca_rows(6)),
    ("aya", F.aya_rows(6)),
    ("oasst", F.oasst_rows(3)),
    ("messages", F.messages_rows(6)),
  ]
  for fmt, rows in cases:
    for template in I.TEMPLATES:
      if fmt == "messages" and template != "chat":
        continue
      data, *_ = I.from_instructions(
        _ds(rows),
        tok,
        format=fmt,
        template=template,
        seq_len=SEQ,
        partitioner_args={"num_clients": 2},
        test_fraction=0.0,
      )
      assert int(data.n_train.sum()) >= 6 and int((np.asarray(data.y_train) > 0).sum()) > 0, (fmt, template)


def test_a_missing_dataset_is_one_line_naming_its_preparation(tmp_path):
  with pytest.raises(
    FileNotFoundError,
    match=r"^config.data.path='/nowhere/alpaca' does not exist; prepare it "
    r"where the Hub is reachable: python -c \"import datasets; "
    r"datasets.load_dataset\('vicgalle/alpaca-gpt4', split='train'\)"
    r".save_to_disk\('/nowhere/alpaca'\)\"$",
  ):
    I.load_dataset_dir("/nowhere/alpaca", hub="'vicgalle/alpaca-gpt4', split='train'")
  (tmp_path / "junk").mkdir()
  with pytest.raises(FileNotFoundError, match=r"holds no dataset written by save_to_disk"):
    I.load_dataset_dir(str(tmp_path / "junk"))


# ------------------------------------------------------------------------ benchmarks against transformers
def _hf(path):
  return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


def test_multiple_choice_log_likelihoods_equal_transformers(checkpoint):
  """MMLU and MedMCQA rows: every choice's log-likelihood equals the sum of transformers' log-softmax
  over the choice's tokens, and the accuracy is the share of argmax choices that are the answer."""
  path, tok = checkpoint
  model, params = load_pretrained(path)
  hf = _hf(path)
  for fmt, rows in (("mmlu", F.mmlu_rows()), ("medmcqa", F.medmcqa_rows())):
    task = I.choice_task(_ds(rows), tok, format=fmt, seq_len=SEQ)
    scores = E.choice_scores(model.apply, params, task.tokens, task.labels, batch_size=5)
    with torch.no_grad():
      logp = torch.log_softmax(hf(torch.tensor(task.tokens.astype(np.int64))).logits, -1).numpy()
    y = task.labels
    ref = np.where(y > 0, np.take_along_axis(logp, y[..., None], -1)[..., 0], 0).sum(-1)
    np.testing.assert_allclose(scores, ref, atol=1e-4)
    expect = np.mean(np.argmax(ref.reshape(-1, task.num_choices), 1) == task.answer)
    assert E.choice_accuracy(model.apply, params, task)["accuracy"] == pytest.approx(expect)
    assert task.num_choices == 4 and (y > 0).sum(1).min() >= 1
  with pytest.raises(ValueError, match=r"choice format 'mmlu' needs column\(s\) \['choices', 'answer'\]"):
    I.choice_task(_ds({"question": ["q"]}), tok)


def test_greedy_generation_equals_transformers_and_exact_match(checkpoint):
  """Prompts of different lengths in one right-padded batch continue exactly as transformers'
  ``generate(do_sample=False)`` of each prompt alone; exact match normalizes case, punctuation and
  articles."""
  path, tok = checkpoint
  model, params = load_pretrained(path)
  hf = _hf(path)
  task = I.generation_task(_ds(F.alpaca_rows(4)), tok, template="flowertune", seq_len=SEQ, max_new_tokens=5)
  assert len(set(task.lengths.tolist())) > 1
  out = E.greedy_generate(model.apply, params, task.prompts, task.lengths, max_new_tokens=5, eos=task.eos)
  for i in range(4):
    ids = torch.tensor(task.prompts[i : i + 1, : task.lengths[i]].astype(np.int64))
    with torch.no_grad():
      ref = hf.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=3)[
        0, ids.shape[1] :
      ]
    np.testing.assert_array_equal(out[i], ref.numpy())
  assert E.exact_match(["The Positive.", "neutral ", "no"], ["positive", "Neutral", "yes"]) == pytest.approx(
    2 / 3
  )
  score = E.generation_exact_match(model.apply, params, task, tok)
  assert score["count"] == 4 and 0.0 <= score["exact_match"] <= 1.0


def test_perplexity_of_a_client_equals_transformers_loss(checkpoint):
  """The evaluator's perplexity of the clients' test splits (response tokens only) is exp of the mean
  cross-entropy of transformers' logits over the same targets (prompt and padding ignored)."""
  from fedtree.core.metrics import make_evaluator, summarize

  path, tok = checkpoint
  model, params = load_pretrained(path, seq_len=SEQ)
  data, *_ = I.from_instructions(
    _ds(F.alpaca_rows(8)), tok, seq_len=SEQ, partitioner_args={"num_clients": 2}, test_fraction=0.5
  )
  stats = make_evaluator(model, None)(
    jax.tree.map(lambda a: a[None], params),
    data.x_test,
    data.y_test,
    data.n_test,
    jnp.zeros(data.num_clients, jnp.int32),
  )
  ppl = summarize(jax.tree.map(np.asarray, stats), np.zeros(2, np.int32), perplexity=True)["perplexity"]
  x = np.concatenate([np.asarray(data.x_test[c, : int(data.n_test[c])]) for c in range(2)])
  y = np.concatenate([np.asarray(data.y_test[c, : int(data.n_test[c])]) for c in range(2)])
  with torch.no_grad():
    logits = _hf(path)(torch.tensor(x.astype(np.int64))).logits
  nll = torch.nn.functional.cross_entropy(
    logits.reshape(-1, logits.shape[-1]), torch.tensor(y.astype(np.int64)).reshape(-1), ignore_index=0
  )
  assert ppl == pytest.approx(float(torch.exp(nll)), rel=1e-4)
