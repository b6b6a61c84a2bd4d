"""Hugging Face checkpoints into fedtree's decoder (fedtree.models.pretrained; issue 50): logits equal
transformers' on tiny random checkpoints of every supported variant, and bad checkpoints are one line.

The checkpoints are written here with ``transformers`` (``save_pretrained``), float32, with weights
drawn at a scale (std 0.3) where attention is far from uniform, so that a wrong position scaling, a
window or a head grouping moves the logits by much more than the tolerance (each variant also checks
that dropping its feature does). Tolerance: 2e-5 absolute on logits of magnitude ~1-10 (float32, the
same operations in another order).
"""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[llm]')")
torch = pytest.importorskip("torch", reason="needs torch (CPU) to run the transformers reference")

from fedtree.models import build_model, decoder_model, load_pretrained  # noqa: E402
from fedtree.models.decoder import RoPE  # noqa: E402
from fedtree.models.pretrained import decoder_config  # noqa: E402

TOL = 2e-5
SMALL = dict(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=8)


def _randomize(model, seed=0, std=0.3):
  """Every weight N(0, std) (norm scales around 1), so that attention is peaked and features show."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g) * std
      p.copy_(1.0 + noise if ("norm" in name or "ln_" in name) and name.endswith("weight") else noise)
  return model.eval()


def _variants():
  T = transformers
  return {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**SMALL)),
    "llama_linear": lambda: T.LlamaForCausalLM(T.LlamaConfig(
      **SMALL, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama_dynamic": lambda: T.LlamaForCausalLM(T.LlamaConfig(
      **SMALL, rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "llama3": lambda: T.LlamaForCausalLM(T.LlamaConfig(
      **SMALL, rope_theta=50.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 6})),
    "yarn": lambda: T.LlamaForCausalLM(T.LlamaConfig(
      **{**SMALL, "max_position_embeddings": 16},
      rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4})),
    "llama_tied_biases_mha": lambda: T.LlamaForCausalLM(T.LlamaConfig(
      **{**SMALL, "num_key_value_heads": 4}, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "mistral_window": lambda: T.MistralForCausalLM(T.MistralConfig(**SMALL, sliding_window=3)),
    "qwen2_window_tied": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(
      **SMALL, use_sliding_window=True, sliding_window=3, max_window_layers=1, tie_word_embeddings=True)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(
      vocab_size=48, n_embd=16, n_layer=2, n_head=4, n_positions=16, bos_token_id=0, eos_token_id=0)),
  }


def _write(tmp_path, name, **save):
  model = _randomize(_variants()[name]())
  path = str(tmp_path / name)
  model.save_pretrained(path, **save)
  return model, path


def _reference(model, x):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(x))).logits.numpy()


def _tokens(vocab, shape=(2, 12), seed=0):
  return np.random.RandomState(seed).randint(0, vocab, shape).astype(np.int32)


def _without(config, name):
  """``config`` with the feature variant ``name`` tests removed: its window, its RoPE scaling, or
  (plain RoPE) another RoPE base; ``None`` for GPT-2 (learned positions, checked by equality)."""
  if "window" in name:
    return dataclasses.replace(config, windows=())
  if name == "gpt2":
    return None
  if config.rope.kind == "default":
    return dataclasses.replace(config, rope=RoPE(theta=config.rope.theta * 10))
  return dataclasses.replace(config, rope=RoPE(theta=config.rope.theta))


@pytest.mark.parametrize("name", list(_variants()))
def test_logits_equal_transformers(tmp_path, name):
  """12 tokens (past the 8-position context where the scaling depends on it: dynamic NTK), batch 2."""
  model, path = _write(tmp_path, name)
  x = _tokens(model.config.vocab_size)
  ref = _reference(model, x)
  pre = load_pretrained(path)
  fm, params = pre
  out = np.asarray(jax.jit(fm.apply)(params, jnp.asarray(x)))
  assert out.shape == (2, 12, model.config.vocab_size) and out.dtype == np.float32
  count = sum(int(np.size(a)) for a in jax.tree.leaves(params))
  assert count == pre.config.parameter_count() == sum(p.numel() for p in model.parameters())
  assert np.abs(ref).max() > 1.0      # weights at a scale where differences show
  np.testing.assert_allclose(out, ref, atol=TOL, rtol=0)
  changed = _without(pre.config, name)
  if changed is not None:   # the tested feature matters: without it, the logits are far off
    wrong = decoder_model(changed, 12)
    off = np.abs(np.asarray(jax.jit(wrong.apply)(params, jnp.asarray(x))) - ref).max()
    assert off > 1e3 * TOL, (name, off)


def test_hub_config_format_rope_scaling_and_shards(tmp_path):
  """A config in the Hub's format (``rope_theta`` and ``rope_scaling``, as transformers 4 wrote it) and
  weights in shards with an index give the same model as transformers' own format."""
  model, path = _write(tmp_path, "llama3", max_shard_size="8KB")
  assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
  cfg_path = os.path.join(path, "config.json")
  cfg = json.load(open(cfg_path))
  rope = cfg.pop("rope_parameters")
  cfg["rope_theta"] = rope.pop("rope_theta")
  cfg["rope_scaling"] = {("type" if k == "rope_type" else k): v for k, v in rope.items()}
  json.dump(cfg, open(cfg_path, "w"))
  x = _tokens(model.config.vocab_size)
  fm, params = load_pretrained(path)
  out = np.asarray(fm.apply(params, jnp.asarray(x)))
  np.testing.assert_allclose(out, _reference(model, x), atol=TOL, rtol=0)


def test_bfloat16(tmp_path):
  """``dtype="bfloat16"`` stores and computes in bfloat16: logits within bfloat16's rounding of the
  float32 ones (a few per cent of their range after 2 layers)."""
  model, path = _write(tmp_path, "llama")
  x = jnp.asarray(_tokens(48))
  fb, p16 = load_pretrained(path, dtype="bfloat16")
  assert {a.dtype for a in jax.tree.leaves(p16)} == {jnp.dtype(jnp.bfloat16)}
  out16 = jax.jit(fb.apply)(p16, x)
  assert out16.dtype == jnp.bfloat16
  ref = _reference(model, x)
  err = np.abs(np.asarray(out16, np.float32) - ref).max()
  assert err < 0.05 * np.abs(ref).max(), err


def test_remat(tmp_path):
  """``remat=True`` gives the same logits and gradients and puts every layer under
  ``jax.checkpoint`` (one ``remat`` equation per layer in the gradient's jaxpr, none without)."""
  _, path = _write(tmp_path, "llama")
  x = jnp.asarray(_tokens(48))
  fm, p32 = load_pretrained(path)
  fr, pr = load_pretrained(path, remat=True)

  def loss(m):
    return lambda p: jnp.mean(jax.nn.log_softmax(m.apply(p, x))[..., 0])

  np.testing.assert_allclose(np.asarray(fr.apply(pr, x)), np.asarray(fm.apply(p32, x)), atol=1e-6)
  g1, g2 = jax.grad(loss(fm))(p32), jax.grad(loss(fr))(pr)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  text = str(jax.make_jaxpr(jax.grad(loss(fr)))(pr))
  remat = r"\b(remat2?|checkpoint)\["
  assert len(re.findall(remat, text)) == 2      # one per layer
  assert not re.findall(remat, str(jax.make_jaxpr(jax.grad(loss(fm)))(p32)))


def test_tokenizer_is_read_beside_the_model(tmp_path):
  """A directory with a tokenizer gives it back (``.tokenizer``), one without gives ``None``."""
  from tokenizers import Tokenizer, models, pre_tokenizers

  _, path = _write(tmp_path, "llama")
  assert load_pretrained(path).tokenizer is None
  vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "hello", "world"])}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                              unk_token="<unk>")
  fast.save_pretrained(path)
  loaded = load_pretrained(path).tokenizer
  assert loaded("hello world", add_special_tokens=False)["input_ids"] == [3, 4]


def test_bad_checkpoints_are_one_clear_line(tmp_path):
  model, path = _write(tmp_path, "llama")
  with pytest.raises(FileNotFoundError, match=r"is not a directory"):
    load_pretrained(str(tmp_path / "nowhere"))
  os.makedirs(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match=r"has no config.json"):
    load_pretrained(str(tmp_path / "empty"))
  cfg = json.load(open(os.path.join(path, "config.json")))
  bad = tmp_path / "arch"
  os.makedirs(bad)
  json.dump({**cfg, "architectures": ["BertForMaskedLM"]}, open(bad / "config.json", "w"))
  with pytest.raises(ValueError, match=r"architecture \['BertForMaskedLM'\] \(model_type 'llama'\) is not "
                                       r"supported; choose one of \['GPT2LMHeadModel', 'LlamaForCausalLM'"):
    load_pretrained(str(bad))
  with pytest.raises(ValueError, match=r"rope_type='longrope' is not supported; choose one of \('default', "):
    decoder_config({**cfg, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}})
  with pytest.raises(ValueError, match=r"hidden_act='tanh' is not supported"):
    decoder_config({**cfg, "hidden_act": "tanh"})
  nofiles = tmp_path / "noweights"
  os.makedirs(nofiles)
  json.dump(cfg, open(nofiles / "config.json", "w"))
  open(nofiles / "pytorch_model.bin", "w").close()
  with pytest.raises(FileNotFoundError,
                     match=r"has no \*.safetensors weights \(it has \['pytorch_model.bin'\]"):
    load_pretrained(str(nofiles))
  wrong = tmp_path / "shape"
  model.save_pretrained(str(wrong))
  json.dump({**cfg, "intermediate_size": 20}, open(wrong / "config.json", "w"))
  with pytest.raises(ValueError, match=r"model.safetensors: tensor 'model.layers.0.mlp.\w+_proj.weight' "
                                       r"has shape \(\d+, \d+\), but the config "
                                       r"\(.*intermediate_size=20.*\) gives"):
    load_pretrained(str(wrong))
  fewer = tmp_path / "fewer"
  model.save_pretrained(str(fewer))
  json.dump({**cfg, "num_hidden_layers": 1}, open(fewer / "config.json", "w"))
  with pytest.raises(ValueError, match=r"tensor\(s\) \['model.layers.1.*are not part of a llama model"):
    load_pretrained(str(fewer))
  more = tmp_path / "more"
  model.save_pretrained(str(more))
  json.dump({**cfg, "num_hidden_layers": 3}, open(more / "config.json", "w"))
  with pytest.raises(ValueError, match=r"tensor\(s\) \['model.layers.2.self_attn.q_proj.weight'.* are "
                                       r"missing"):
    load_pretrained(str(more))
  with pytest.raises(ValueError, match=r"dtype='int4'; choose one of"):
    load_pretrained(path, dtype="int4")


def test_a_config_takes_the_checkpoint(tmp_path):
  """``build_model("pretrained", checkpoint=DIR)`` (``--config.model.checkpoint=DIR``) is the
  checkpoint's decoder over the data's sequence length; a missing checkpoint is one line."""
  model, path = _write(tmp_path, "qwen2_window_tied")
  m = build_model("pretrained", example_shape=(12,), num_classes=48, checkpoint=path)
  assert m.label_shape == (12,) and m.input_dtype == "int32" and m.num_classes == 48
  with pytest.raises(ValueError, match=r"model 'pretrained' vocabulary of 48 tokens but the data has 50 "
                                       r"classes"):
    build_model("pretrained", example_shape=(12,), num_classes=50, checkpoint=path)
  with pytest.raises(ValueError, match=r"model 'pretrained' needs checkpoint=DIR"):
    build_model("pretrained", example_shape=(12,), num_classes=48)
