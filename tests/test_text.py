"""Text in the padded layout (paper 000's task): tokenizer, vocabulary, corpora, masked loss
and perplexity."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedtree.core.local import Batch, SGDCarry, make_sgd_step
from fedtree.core.metrics import evaluate, summarize
from fedtree.core.model import Model, masked_cross_entropy
from fedtree.datasets import text
from fedtree.models import build_model


def test_tokenizer_round_trip():
  s = "Return the value of x.attr, or None: see PEP 8!"
  words = text.tokenize(s)
  assert words == ["return", "the", "value", "of", "x", ".", "attr", ",", "or", "none", ":", "see",
                   "pep", "8", "!"]
  vocab = text.build_vocabulary([words], vocab_size=100)
  assert vocab.decode(vocab.encode(words)) == words
  chars = text.tokenize(s, level="char", lowercase=False)
  assert text.detokenize(chars, level="char") == s
  cv = text.build_vocabulary([chars], vocab_size=100, level="char")
  assert text.detokenize(cv.decode(cv.encode(chars)), level="char") == s
  # beyond the cap, rare tokens become <oov>; ties are broken by the token, not by order
  small = text.build_vocabulary([["b", "a", "c", "a", "b"]], vocab_size=6)
  assert small.tokens[4:] == ("a", "b")
  assert small.encode(["c", "a"]) == [text.OOV, 4]
  with pytest.raises(ValueError, match="level"):
    text.tokenize("x", level="byte")
  with pytest.raises(ValueError, match="vocab_size"):
    text.build_vocabulary([["a"]], vocab_size=3)


def test_encode_shifts_targets_and_pads_with_zero():
  vocab = text.build_vocabulary([["a", "b", "c"]], vocab_size=10)
  x, y = text.encode_sentences([["a", "b"], ["c", "a", "b", "c"]], vocab, seq_len=4)
  a, b, c = vocab.encode(["a", "b", "c"])
  np.testing.assert_array_equal(x, [[text.BOS, a, b, 0], [text.BOS, c, a, b]])
  np.testing.assert_array_equal(y, [[a, b, text.EOS, 0], [c, a, b, c]])  # truncated at T


def _encode_loop(token_lists, vocab, seq_len):
  """A loop over sentences: the reference of the vectorized encode_sentences."""
  x = np.zeros((len(token_lists), seq_len), np.int32)
  y = np.zeros((len(token_lists), seq_len), np.int32)
  for i, toks in enumerate(token_lists):
    ids = [text.BOS] + vocab.encode(toks) + [text.EOS]
    inp, tgt = ids[:-1][:seq_len], ids[1:][:seq_len]
    x[i, : len(inp)], y[i, : len(tgt)] = inp, tgt
  return x, y


@pytest.mark.parametrize("seq_len", [1, 2, 5, 9])
def test_encode_sentences_matches_a_loop_over_sentences(seq_len):
  rng = np.random.default_rng(seq_len)
  words = [f"w{i}" for i in range(30)]
  vocab = text.build_vocabulary([words[:12]], vocab_size=10)   # some words out of vocabulary
  lists = [list(rng.choice(words, int(n))) for n in rng.integers(0, 12, 40)] + [[]]
  for got, want in zip(text.encode_sentences(lists, vocab, seq_len), _encode_loop(lists, vocab, seq_len),
                       strict=True):
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
  x, y = text.encode_sentences([], vocab, seq_len)
  assert x.shape == y.shape == (0, seq_len)
  x, y = text.encode_sentences([[], []], vocab, seq_len)   # no token at all
  np.testing.assert_array_equal(x, _encode_loop([[], []], vocab, seq_len)[0])


def _corpus():
  sentences = tuple(tuple(f"common word{c} unique{c}x{i} ." for i in range(4 + c)) for c in range(5))
  return text.TextCorpus(clients=tuple(f"c{i}" for i in range(5)), sentences=sentences,
                         groups=(0, 0, 1, 1, 1), group_names=("g0", "g1"))


def test_vocabulary_comes_from_training_clients_only():
  corpus = _corpus()
  data, groups, vocab = text.to_federated(corpus, seq_len=8, vocab_size=1000, test_fraction=0.5, seed=3)
  np.testing.assert_array_equal(groups, [0, 0, 1, 1, 1])
  train_tokens = set()
  for c in range(5):
    for row in np.asarray(data.x_train[c, : int(data.n_train[c])]):
      train_tokens.update(vocab.decode(row))
  test_tokens = set()
  for c in range(5):
    for row in np.asarray(data.y_test[c, : int(data.n_test[c])]):
      test_tokens.update(t for t in vocab.decode(row) if t != "<oov>")
  assert set(vocab.tokens[4:]) <= train_tokens
  # every sentence holds a token seen nowhere else: test sentences' ones are <oov>
  assert not any(t.startswith("unique") for t in test_tokens)
  assert int(np.sum(np.asarray(data.y_test) == text.OOV)) == int(np.sum(np.asarray(data.n_test)))
  # nothing lost: train + test sentences = the corpus
  np.testing.assert_array_equal(np.asarray(data.n_train) + np.asarray(data.n_test),
                                [len(s) for s in corpus.sentences])


def test_stdlib_corpus_is_deterministic():
  a = text.stdlib_corpus(packages=("json", "wsgiref"), min_sentences=2)
  b = text.stdlib_corpus(packages=("json", "wsgiref"), min_sentences=2)
  assert a == b
  assert a.group_names == ("json", "wsgiref")
  assert all(c.startswith(("json.", "wsgiref.")) for c in a.clients)
  assert list(a.clients) == sorted(a.clients)
  da, ga, va = text.to_federated(a, seq_len=12, vocab_size=300)
  db, gb, vb = text.to_federated(b, seq_len=12, vocab_size=300)
  assert va == vb
  for f in ("x_train", "y_train", "n_train", "x_test", "y_test", "n_test"):
    np.testing.assert_array_equal(getattr(da, f), getattr(db, f))
  with pytest.raises(ValueError, match="not a directory"):
    text.stdlib_corpus(packages=("no_such_package",))


def test_text_dir_loader(tmp_path):
  for group, client, lines in [("sci", "b", ["one two .", "", "three"]), ("sci", "a", ["x y"]),
                               ("art", "z", ["p q r", "s"])]:
    (tmp_path / group).mkdir(exist_ok=True)
    (tmp_path / group / f"{client}.txt").write_text("\n".join(lines) + "\n")
  corpus = text.text_dir_corpus(str(tmp_path))
  assert corpus.clients == ("art/z", "sci/a", "sci/b")
  assert corpus.group_names == ("art", "sci")
  assert corpus.groups == (0, 1, 1)
  assert corpus.sentences[2] == ("one two .", "three")
  with pytest.raises(ValueError, match="not a directory"):
    text.text_dir_corpus(str(tmp_path / "missing"))
  (tmp_path / "art" / "empty.txt").write_text("\n \n")
  with pytest.raises(ValueError, match="empty client"):
    text.text_dir_corpus(str(tmp_path))


def _lm_batch(seed=0, b=3, t=6, v=11):
  rng = np.random.default_rng(seed)
  x = rng.integers(1, v, (b, t)).astype(np.int32)
  y = rng.integers(1, v, (b, t)).astype(np.int32)
  lengths = np.array([6, 3, 1])
  for i, n in enumerate(lengths):
    x[i, n:] = 0
    y[i, n:] = 0
  mask = np.array([True, True, False])      # the third sentence is padding
  return x, y, mask


def test_padded_tokens_change_no_loss_or_gradient():
  model = build_model("lstm_lm", example_shape=(6,), num_classes=11, embed=4, hidden=5, layers=1)
  params = model.init(jax.random.key(0))
  opt = optax.sgd(0.1)
  step = jax.jit(make_sgd_step(model, opt))
  value_and_grad = jax.jit(jax.value_and_grad(
    lambda p, b: masked_cross_entropy(model.apply(p, b.x), b.y, b.mask)))
  x, y, mask = _lm_batch()

  def loss_grad_step(x, y):
    batch = Batch(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))
    loss, grads = value_and_grad(params, batch)
    carry, _ = step(SGDCarry(params=params, opt_state=opt.init(params), anchor=params), batch,
                    jax.random.key(1))
    return loss, grads, carry.params

  base = loss_grad_step(x, y)
  x2, y2 = x.copy(), y.copy()
  x2[1, 3:] = 7                   # padded positions of a real sentence (inputs after its end)
  x2[2], y2[2] = 5, 9             # a padded sentence, labels included
  other = loss_grad_step(x2, y2)
  np.testing.assert_allclose(base[0], other[0], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(base[1:]), jax.tree.leaves(other[1:]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  # ... while a real label does change it (the test can fail)
  y3 = y.copy()
  y3[0, 0] = (y3[0, 0] % 10) + 1
  assert abs(float(loss_grad_step(x, y3)[0]) - float(base[0])) > 1e-6


def test_uniform_logits_have_perplexity_equal_to_vocabulary_size():
  v, t = 13, 5
  uniform = Model(init=lambda key: {"w": jnp.zeros(())},
                  apply=lambda p, x, train=False, rng=None: jnp.zeros(x.shape + (v,)) + p["w"],
                  num_classes=v, input_dtype="int32", label_shape=(t,))
  rng = np.random.default_rng(0)
  y = rng.integers(1, v, (3, 4, t)).astype(np.int32)
  y[:, :, 3:] = 0
  x = y.copy()
  n = jnp.asarray([4, 2, 1])
  params = {"w": jnp.zeros((3,))}
  stats = evaluate(uniform, params, jnp.asarray(x), jnp.asarray(y), n)
  np.testing.assert_allclose(np.asarray(stats.count), [12, 6, 3])      # tokens, padding excluded
  s = summarize(stats, np.array([0, 1, 1]), perplexity=True)
  assert s["perplexity"] == pytest.approx(v, rel=1e-5)
  np.testing.assert_allclose(s["client_perplexity"], v, rtol=1e-5)
  np.testing.assert_allclose(s["group_perplexity"], v, rtol=1e-5)
  assert "perplexity" not in summarize(stats)


def test_perplexity_is_exp_of_total_nll_over_total_tokens():
  v, t = 7, 4
  rng = np.random.default_rng(1)
  table = rng.normal(size=(v, v)).astype(np.float32)          # logits depend on the input token
  model = Model(init=lambda key: {"w": jnp.asarray(table)},
                apply=lambda p, x, train=False, rng=None: p["w"][x],
                num_classes=v, input_dtype="int32", label_shape=(t,))
  x = rng.integers(1, v, (2, 3, t)).astype(np.int32)
  y = rng.integers(1, v, (2, 3, t)).astype(np.int32)
  y[0, 1, 2:] = 0
  y[1, 0, 1:] = 0
  n = np.array([2, 3])
  params = {"w": jnp.stack([jnp.asarray(table)] * 2)}
  stats = evaluate(model, params, jnp.asarray(x), jnp.asarray(y), jnp.asarray(n))
  logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
  nll, tok, right = np.zeros(2), np.zeros(2), np.zeros(2)
  for c in range(2):
    for m in range(n[c]):
      for i in range(t):
        if y[c, m, i]:
          nll[c] -= logp[x[c, m, i], y[c, m, i]]
          tok[c] += 1
          right[c] += int(np.argmax(table[x[c, m, i]]) == y[c, m, i])
  np.testing.assert_allclose(np.asarray(stats.loss_sum), nll, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(stats.count), tok)
  np.testing.assert_array_equal(np.asarray(stats.correct), right)
  s = summarize(stats, np.array([0, 0]), perplexity=True)
  assert s["perplexity"] == pytest.approx(np.exp(nll.sum() / tok.sum()), rel=1e-5)
  np.testing.assert_allclose(s["client_perplexity"], np.exp(nll / tok), rtol=1e-5)
  # per group: total NLL over total tokens, not a mean of the clients' perplexities
  assert s["group_perplexity"][0] == pytest.approx(np.exp(nll.sum() / tok.sum()), rel=1e-5)


def test_sentence_perplexity_against_hand_computation():
  """``sentence_perplexity`` = exp(mean over sentences of the sentence's mean token NLL),
  computed by hand; a row without a real token is no sentence; confusion counts still come
  in their place when both are asked for."""
  from fedtree.core.metrics import make_evaluator, perplexities

  v, t = 6, 5
  rng = np.random.default_rng(2)
  table = rng.normal(size=(v, v)).astype(np.float32)
  model = Model(init=lambda key: {"w": jnp.asarray(table)},
                apply=lambda p, x, train=False, rng=None: p["w"][x],
                num_classes=v, input_dtype="int32", label_shape=(t,))
  x = rng.integers(1, v, (3, 3, t)).astype(np.int32)
  y = rng.integers(1, v, (3, 3, t)).astype(np.int32)
  y[0, 0, 1:] = 0          # a one-token sentence
  y[1, 1, 3:] = 0
  y[2, 0, :] = 0           # a real row without a token: not a sentence
  n = np.array([3, 2, 2])
  groups = np.array([0, 1, 1])
  logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
  sent_nll = [[], [], []]
  for c in range(3):
    for m in range(n[c]):
      toks = [-logp[x[c, m, i], y[c, m, i]] for i in range(t) if y[c, m, i]]
      if toks:
        sent_nll[c].append(np.mean(toks))
  params = {"w": jnp.stack([jnp.asarray(table)] * 3)}
  stats = make_evaluator(model, confusion=True)(params, jnp.asarray(x), jnp.asarray(y),
                                                 jnp.asarray(n), jnp.arange(3))
  np.testing.assert_allclose(np.asarray(stats.sentence_loss), [sum(s) for s in sent_nll], rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(stats.sentences), [3, 2, 1])
  assert np.asarray(stats.confusion).shape == (3, v, v)
  np.testing.assert_array_equal(np.asarray(stats.confusion).sum(axis=(1, 2)), np.asarray(stats.count))
  s = summarize(stats, groups, perplexity=True)
  every = [a for c in sent_nll for a in c]
  assert s["sentence_perplexity"] == pytest.approx(np.exp(np.mean(every)), rel=1e-5)
  np.testing.assert_allclose(s["client_sentence_perplexity"], [np.exp(np.mean(a)) for a in sent_nll],
                             rtol=1e-5)
  np.testing.assert_allclose(s["group_sentence_perplexity"],
                             [np.exp(np.mean(sent_nll[0])), np.exp(np.mean(sent_nll[1] + sent_nll[2]))],
                             rtol=1e-5)
  # sentence level differs from token level here (sentences of different lengths)
  assert abs(s["sentence_perplexity"] - s["perplexity"]) > 1e-3
  assert perplexities(stats, "token")[0] == pytest.approx(s["perplexity"])
  with pytest.raises(ValueError, match="level='word'"):
    perplexities(stats, "word")
  plain = make_evaluator(model, sentences=False)(params, jnp.asarray(x), jnp.asarray(y), jnp.asarray(n),
                                                 jnp.arange(3))
  assert plain.sentences is None and "sentence_perplexity" not in summarize(plain)
  with pytest.raises(ValueError, match="sentences=True"):
    perplexities(plain, "sentence")


def test_sentence_sums_refuse_class_labels():
  from fedtree.core.metrics import client_sums

  clf = Model(init=lambda key: {}, apply=lambda p, x, train=False, rng=None: jnp.zeros((x.shape[0], 3)),
              num_classes=3, input_dtype="float32")
  with pytest.raises(ValueError, match="token labels"):
    client_sums(clf, {}, jnp.zeros((4, 2)), jnp.zeros((4,), jnp.int32), 4, sentences=True)
