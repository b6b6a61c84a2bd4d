"""Language models (paper 000): the LSTM against a hand-written cell loop, shapes vectorized
over clients, parameter counts, and clear size errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.models import build_model
from fedtree.models.lm import lstm_cell


def _reference_lstm(params, tokens):
  """Plain Python loop over time with the textbook LSTM equations (no lax.scan)."""
  x = np.asarray(params["embed"]["embedding"])[np.asarray(tokens)]          # [B, T, E]
  for layer in ("lstm0", "lstm1"):
    p = {k: np.asarray(v, np.float64) for k, v in params[layer].items()}
    hdim = p["w_h"].shape[0]
    h = np.zeros((x.shape[0], hdim))
    c = np.zeros((x.shape[0], hdim))
    out = []
    for t in range(x.shape[1]):
      z = x[:, t] @ p["w_x"] + h @ p["w_h"] + p["b"]
      i, f, g, o = (z[:, k * hdim:(k + 1) * hdim] for k in range(4))
      sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
      c = sig(f) * c + sig(i) * np.tanh(g)
      h = sig(o) * np.tanh(c)
      out.append(h)
    x = np.stack(out, axis=1)
  return x @ np.asarray(params["out"]["kernel"]) + np.asarray(params["out"]["bias"])


def test_lstm_matches_hand_written_loop():
  model = build_model("lstm_lm", example_shape=(5,), num_classes=9, embed=3, hidden=4, layers=2)
  params = model.init(jax.random.key(0))
  tokens = np.array([[1, 4, 8, 2, 0], [3, 3, 0, 0, 0]], np.int32)
  np.testing.assert_allclose(model.apply(params, jnp.asarray(tokens)), _reference_lstm(params, tokens),
                             rtol=1e-4, atol=1e-5)
  # the cell itself: forget-gate bias 1 at init
  np.testing.assert_array_equal(np.asarray(params["lstm0"]["b"])[4:8], 1.0)
  (h, c), out = lstm_cell(params["lstm0"], (jnp.zeros((2, 4)), jnp.zeros((2, 4))), jnp.ones((2, 3)))
  np.testing.assert_array_equal(h, out)


@pytest.mark.parametrize("name,kw,count", [
  # embed 9*3 + lstm (3+4+1)*16 + (4+4+1)*16 + out 4*9+9
  ("lstm_lm", dict(embed=3, hidden=4, layers=2), 27 + 128 + 144 + 45),
  ("transformer_lm", dict(dim=8, depth=1, heads=2, mlp_dim=16), None),
])
def test_lm_vectorized_over_clients(name, kw, count):
  model = build_model(name, example_shape=(5,), num_classes=9, **kw)
  keys = jax.random.split(jax.random.key(1), 3)
  params = jax.vmap(model.init)(keys)                                         # 3 clients
  x = jnp.asarray(np.random.default_rng(0).integers(0, 9, (3, 2, 5)), jnp.int32)
  logits = jax.vmap(model.apply)(params, x)
  assert logits.shape == (3, 2, 5, 9)
  # each client's output is its own model's output
  one = model.apply(jax.tree.map(lambda p: p[1], params), x[1])
  np.testing.assert_allclose(logits[1], one, rtol=1e-5, atol=1e-6)
  n = sum(int(np.prod(p.shape[1:])) for p in jax.tree.leaves(params))
  if count is not None:
    assert n == count
  assert model.input_dtype == "int32" and model.label_shape == (5,)


def test_transformer_is_causal():
  model = build_model("transformer_lm", example_shape=(6,), num_classes=7, dim=8, depth=1, heads=2,
                      mlp_dim=16)
  params = model.init(jax.random.key(0))
  a = jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32)
  b = a.at[0, 4:].set(1)
  la, lb = model.apply(params, a), model.apply(params, b)
  np.testing.assert_allclose(la[0, :4], lb[0, :4], rtol=1e-5, atol=1e-6)
  assert not np.allclose(la[0, 4:], lb[0, 4:])


def test_char_embedding_and_errors():
  chars = np.array([[0, 0], [0, 0], [0, 0], [0, 0], [3, 4], [5, 0]], np.int32)
  model = build_model("lstm_lm", example_shape=(4,), num_classes=6, embed=5, hidden=4, layers=1,
                      embedding="chars", char_ids=chars)
  params = model.init(jax.random.key(0))
  assert "char_embed" in params and "embed" not in params
  assert model.apply(params, jnp.zeros((2, 4), jnp.int32) + 4).shape == (2, 4, 6)
  with pytest.raises(ValueError, match="vocab_size=7"):
    build_model("lstm_lm", example_shape=(4,), num_classes=6, vocab_size=7)
  with pytest.raises(ValueError, match="char_ids"):
    build_model("lstm_lm", example_shape=(4,), num_classes=6, embedding="chars", char_ids=chars[:3])
  with pytest.raises(ValueError, match="embedding='bytes'"):
    build_model("lstm_lm", example_shape=(4,), num_classes=6, embedding="bytes")
  with pytest.raises(ValueError, match="example_shape"):
    build_model("transformer_lm", example_shape=(4, 2), num_classes=6)


def _tiny_lm_config(group_rounds):
  from config_files import load_config

  c = load_config("group_personalized_lm")
  c.rounds, c.rounds_per_call, c.eval_every, c.progress = 2, 2, 2, False
  c.data.packages = ("json", "wsgiref")
  c.data.min_sentences, c.data.max_sentences = 2, 6
  c.data.seq_len, c.data.vocab_size = 8, 120
  c.model.embed, c.model.hidden = 4, 8
  c.local.batch_size = 4
  g = c.runs.grouppfl
  g.group_rounds, g.cohort_size = group_rounds, 2
  g.finetune.epochs, g.finetune.learning_rates = 1, (0.1, 0.5)
  return c


def _write_text_dir(root):
  """Two topics of two clients each, a few short sentences per client."""
  words = {"art": ("paint", "color", "canvas", "brush"), "sci": ("atom", "cell", "force", "mass")}
  for group, ws in words.items():
    for c in range(2):
      (root / group).mkdir(parents=True, exist_ok=True)
      lines = [f"the {ws[i % 4]} and {ws[(i + c) % 4]} ." for i in range(6)]
      (root / group / f"page{c}.txt").write_text("\n".join(lines) + "\n")


def _tiny_text_dir_config(root, cache_dir, **model):
  """``configs/group_personalized_lm.py:text_dir`` shrunk to 1 + 1 rounds of tiny models."""
  from config_files import load_config

  c = load_config("group_personalized_lm", "text_dir")
  c.rounds, c.rounds_per_call, c.eval_every, c.progress = 1, 1, 1, False
  c.data.root, c.data.cache_dir = str(root), cache_dir and str(cache_dir)
  c.data.seq_len, c.data.vocab_size = 8, 40
  c.model.embed, c.model.hidden = 4, 8
  c.model.update(model)
  c.local.batch_size = 4
  g = c.runs.grouppfl
  g.group_rounds, g.cohort_size = 1, 2
  g.finetune.epochs, g.finetune.learning_rates = 1, (0.1,)
  return c


def test_char_table_comes_from_the_data_vocabulary(tmp_path):
  """``model.embedding="chars"``: the character table is built from the loaded data's
  vocabulary (one row per word: its bytes + 1, ``char_len`` columns)."""
  from fedtree.datasets.text import Vocabulary
  from fedtree.experiment.data import DataInfo, load_with_info, model_options

  _write_text_dir(tmp_path / "corpus")
  config = _tiny_text_dir_config(tmp_path / "corpus", tmp_path / "cache", embedding="chars", char_len=6)
  data, _, _, info = load_with_info(config.data)
  assert info.group_names == ("art", "sci") and len(info.vocab) == data.num_classes
  opts = model_options(dict(config.model), info)
  assert "char_len" not in opts and opts["char_ids"].shape == (data.num_classes, 6)
  word = info.vocab.index("canvas")
  np.testing.assert_array_equal(opts["char_ids"][word], np.frombuffer(b"canvas", np.uint8) + 1)
  np.testing.assert_array_equal(opts["char_ids"], Vocabulary(info.vocab).char_table(6))
  assert model_options({"name": "lstm_lm"}, info) == {"name": "lstm_lm"}
  with pytest.raises(ValueError, match="no vocabulary"):
    model_options({"name": "lstm_lm", "embedding": "chars"}, DataInfo())


def test_group_personalized_lm_text_dir_end_to_end(tmp_path):
  """The suite's default LM run: the ``:text_dir`` variant on a generated corpus (global stage
  only, 1 round). The report names the groups by the corpus's folders, the converted arrays
  are cached, perplexity is reported at token and sentence level (also per round)."""
  from fedtree import experiment

  _write_text_dir(tmp_path / "corpus")
  config = _tiny_text_dir_config(tmp_path / "corpus", tmp_path / "cache")
  config.runs.grouppfl.stages = ("global",)
  results = experiment.train_and_evaluate(config, str(tmp_path / "work"))["grouppfl"]
  fl = results["FL"]
  assert 1.0 < fl["perplexity"] < 40 * 1.5 and 1.0 < fl["sentence_perplexity"] < 40 * 1.5
  assert fl["group_sentence_perplexity"].shape == (2,)
  text = (tmp_path / "work" / "grouppfl_report.md").read_text()
  assert "| art |" in text and "| sci |" in text and "| g0 |" not in text
  assert "sentence_perplexity per group" in text
  assert len(list((tmp_path / "cache").glob("text_dir-*.npz"))) == 1
  assert "FL/sentence_perplexity" in (tmp_path / "work" / "metrics.jsonl").read_text()
  assert (tmp_path / "work" / "plot_perplexity.png").stat().st_size > 1000


@pytest.mark.slow
def test_char_embedding_from_config_end_to_end(tmp_path):
  """``model.embedding="chars"`` from a config, end to end (1 round of the global stage)."""
  from fedtree import experiment

  _write_text_dir(tmp_path / "corpus")
  config = _tiny_text_dir_config(tmp_path / "corpus", None, embedding="chars", char_len=6)
  config.runs.grouppfl.stages = ("global",)
  assert "char_embed" in experiment.make_context(config).model.init(jax.random.key(0))
  results = experiment.train_and_evaluate(config, None)["grouppfl"]
  assert np.isfinite(results["FL"]["perplexity"])


@pytest.mark.slow
def test_group_personalized_lm_text_dir_all_methods(tmp_path):
  """The ``:text_dir`` variant with all three stages: the four methods, each with token- and
  sentence-level perplexity."""
  from fedtree import experiment

  _write_text_dir(tmp_path / "corpus")
  config = _tiny_text_dir_config(tmp_path / "corpus", tmp_path / "cache")
  results = experiment.train_and_evaluate(config, str(tmp_path / "work"))["grouppfl"]
  assert list(results) == ["FL", "PerFL", "GroupFL", "GroupPerFL"]
  for r in results.values():
    assert 1.0 < r["perplexity"] < 40 * 1.5 and r["group_perplexity"].shape == (2,)
    assert 1.0 < r["sentence_perplexity"] < 40 * 1.5


def test_chunk_policy_keeps_a_paper_sized_lstm_in_memory():
  """Paper 000's LSTM (2x512, embeddings of 100, 20K words: 15.6M parameters per client copy):
  one client per chunk on CPU, and on an 80 GB accelerator at most half of it per chunk."""
  import optax

  from fedtree.core import tuning

  model = build_model("lstm_lm", example_shape=(20,), num_classes=20_000, embed=100, hidden=512, layers=2)
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  assert sum(int(np.prod(p.shape)) for p in jax.tree.leaves(shapes)) == 15_614_624
  b = tuning.client_step_bytes(model, optax.sgd(0.1), (20,), 16)
  assert b > 4 * 15_614_624                       # at least the params it writes
  assert tuning.default_chunk_size(1000, backend="cpu", client_bytes=b) == 1
  gpu = 80 * 2**30
  chunk = tuning.default_chunk_size(4096, backend="gpu", client_bytes=b, device_bytes=gpu)
  assert 1 <= chunk and chunk * b <= gpu // 2
  assert tuning.default_chunk_size(4096, backend="gpu") == 4096      # unmeasured: the whole cohort (H100)
