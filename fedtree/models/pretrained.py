"""Hugging Face checkpoints into fedtree's decoder: :func:`load_pretrained`.

A checkpoint directory as ``save_pretrained`` writes it (and as the Hub serves it): ``config.json``,
the weights in ``*.safetensors`` (one file, or shards named by ``model.safetensors.index.json``) and
the tokenizer's files. The config is read into a :class:`~fedtree.models.decoder.DecoderConfig`
(:func:`decoder_config`), the tensors with the ``safetensors`` library, transposed to flax's
``[in, out]`` kernels and checked against the config's shapes one by one, and the tokenizer with
``transformers`` (``AutoTokenizer``), else ``tokenizers`` (``tokenizer.json``).

Supported (:data:`ARCHITECTURES`): ``LlamaForCausalLM`` (Llama 2/3, TinyLlama, SmolLM, ...),
``MistralForCausalLM``, ``Qwen2ForCausalLM`` and ``GPT2LMHeadModel``. Both config formats are read:
the Hub's (``rope_theta``, ``rope_scaling``) and ``transformers`` 5's (``rope_parameters``). An
architecture, a RoPE scaling or an option outside these is refused in one line naming it and what
is supported, never approximated.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

from fedtree.core.model import Model
from fedtree.models.decoder import ROPE_TYPES, DecoderConfig, RoPE, decoder_model, windows_of

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "GPT2LMHeadModel": "gpt2"}
"""The Hugging Face architectures :func:`load_pretrained` reads, and their ``model_type``."""
DTYPES = ("float32", "bfloat16", "float16")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")
"""Buffers older checkpoints carry beside the weights (recomputed, not learned)."""


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """What :func:`load_pretrained` read. Unpacks as ``model, params = load_pretrained(dir)``.

  Attributes:
    model: the decoder (:class:`~fedtree.core.model.Model`): ``apply(params, tokens int32[B, T])``
      gives logits ``[B, T, vocab]``.
    params: its parameters, the checkpoint's weights (flax layout).
    tokenizer: the checkpoint's tokenizer (a ``transformers`` tokenizer, else a
      ``tokenizers.Tokenizer``), or ``None`` where the directory has none.
    config: the decoder's shape (:class:`~fedtree.models.decoder.DecoderConfig`).
    architecture: the checkpoint's Hugging Face architecture (``"LlamaForCausalLM"``, ...).
    directory: where it was read from.
  """

  model: Model
  params: Any
  tokenizer: Any
  config: DecoderConfig
  architecture: str
  directory: str

  def __iter__(self):
    return iter((self.model, self.params))


# ------------------------------------------------------------------------ config.json
def read_config(directory: str) -> dict[str, Any]:
  """The checkpoint's ``config.json`` as a dict.

  Raises:
    FileNotFoundError: ``directory`` is not a directory, or holds no ``config.json``.
  """
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"checkpoint {directory!r} is not a directory (a folder written by "
                            f"save_pretrained, with config.json and *.safetensors)")
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint {directory!r} has no config.json (it has "
                            f"{sorted(os.listdir(directory))})")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def architecture_of(hf: dict[str, Any], where: str) -> str:
  """The supported architecture ``hf`` (a ``config.json``) names.

  Raises:
    ValueError: none of :data:`ARCHITECTURES` (the message names what the config says).
  """
  names = list(hf.get("architectures") or [])
  for name in names:
    if name in ARCHITECTURES:
      return name
  by_type = {t: a for a, t in ARCHITECTURES.items()}
  if not names and hf.get("model_type") in by_type:
    return by_type[hf["model_type"]]
  raise ValueError(f"{where}: architecture {names or None} (model_type {hf.get('model_type')!r}) is not "
                   f"supported; choose one of {sorted(ARCHITECTURES)}")


def _rope(hf: dict[str, Any], where: str) -> RoPE:
  params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  if params and all(isinstance(v, dict) for v in params.values()):
    raise ValueError(f"{where}: per-layer-type RoPE parameters {sorted(params)} are not supported")
  kind = params.get("rope_type", params.get("type", "default"))
  if kind not in ROPE_TYPES:
    raise ValueError(f"{where}: rope_type={kind!r} is not supported; choose one of {ROPE_TYPES}")
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  if float(hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
    raise ValueError(f"{where}: partial_rotary_factor={hf.get('partial_rotary_factor')} is not supported "
                     f"(1.0 only)")
  original = params.get("original_max_position_embeddings", hf.get("original_max_position_embeddings"))
  if kind in ("llama3", "yarn") and original is None:
    original = hf.get("max_position_embeddings")
  factor = params.get("factor")
  if kind != "default" and factor is None and kind != "yarn":
    raise ValueError(f"{where}: rope_type={kind!r} needs a 'factor'")
  if kind == "yarn" and factor is None:
    factor = hf["max_position_embeddings"] / original
  return RoPE(theta=float(theta), kind=kind, factor=float(factor if factor is not None else 1.0),
              low_freq_factor=float(params.get("low_freq_factor", 1.0)),
              high_freq_factor=float(params.get("high_freq_factor", 4.0)),
              original_max_positions=None if original is None else int(original),
              beta_fast=float(params.get("beta_fast") or 32.0),
              beta_slow=float(params.get("beta_slow") or 1.0),
              attention_factor=params.get("attention_factor"), mscale=params.get("mscale"),
              mscale_all_dim=params.get("mscale_all_dim"), truncate=bool(params.get("truncate", True)))


def _activation(hf: dict[str, Any], key: str, where: str) -> str:
  act = hf.get(key, "silu")
  if act not in _ACTIVATIONS:
    raise ValueError(f"{where}: {key}={act!r} is not supported; choose one of {sorted(_ACTIVATIONS)}")
  return _ACTIVATIONS[act]


def _windows(hf: dict[str, Any], kind: str, layers: int, where: str) -> tuple:
  window = hf.get("sliding_window")
  if kind == "mistral":
    return windows_of(layers, window)
  if kind == "qwen2":
    types = hf.get("layer_types")
    if types is not None:
      unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
      if unknown or len(types) != layers:
        raise ValueError(f"{where}: layer_types {types} must give one of 'full_attention', "
                         f"'sliding_attention' for each of the {layers} layers")
      if any(t == "sliding_attention" for t in types) and window is None:
        raise ValueError(f"{where}: layer_types has sliding layers but sliding_window is null")
      return windows_of(layers, window, [t == "sliding_attention" for t in types])
    if not hf.get("use_sliding_window", False) or window is None:
      return ()
    start = int(hf.get("max_window_layers", layers))
    return windows_of(layers, window, [i >= start for i in range(layers)])
  return ()


def decoder_config(hf: dict[str, Any], *, where: str = "config.json") -> tuple[str, DecoderConfig]:
  """``(architecture, DecoderConfig)`` of a Hugging Face ``config.json`` (a dict).

  Raises:
    ValueError: an unsupported architecture, RoPE scaling, activation or option (named).
  """
  arch = architecture_of(hf, where)
  kind = ARCHITECTURES[arch]
  if kind == "gpt2":
    for flag, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                     ("add_cross_attention", False)):
      if bool(hf.get(flag, ok)) != ok:
        raise ValueError(f"{where}: GPT-2 with {flag}={hf.get(flag)!r} is not supported ({ok} only)")
    d, heads = int(hf["n_embd"]), int(hf["n_head"])
    return arch, DecoderConfig(
      vocab_size=int(hf["vocab_size"]), hidden_size=d, num_layers=int(hf["n_layer"]), num_heads=heads,
      num_kv_heads=heads, head_dim=d // heads, intermediate_size=int(hf.get("n_inner") or 4 * d),
      norm="layer",
      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
      activation=_activation(hf, "activation_function", where), gated_mlp=False, positions="learned",
      max_positions=int(hf.get("n_positions", 1024)), tie_embeddings=True, qkv_bias=True, out_bias=True,
      mlp_bias=True)
  d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  layers = int(hf["num_hidden_layers"])
  bias = bool(hf.get("attention_bias", False))
  return arch, DecoderConfig(
    vocab_size=int(hf["vocab_size"]), hidden_size=d, num_layers=layers, num_heads=heads,
    num_kv_heads=int(hf.get("num_key_value_heads") or heads), head_dim=int(hf.get("head_dim") or d // heads),
    intermediate_size=int(hf["intermediate_size"]), norm="rms", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    activation=_activation(hf, "hidden_act", where), gated_mlp=True, positions="rope",
    max_positions=int(hf.get("max_position_embeddings", 2048)), rope=_rope(hf, where),
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    qkv_bias=True if kind == "qwen2" else bias, out_bias=bias if kind == "llama" else False,
    mlp_bias=bool(hf.get("mlp_bias", False)) if kind == "llama" else False,
    windows=_windows(hf, kind, layers, where))


# ------------------------------------------------------------------------ the tensors
def weight_files(directory: str) -> list[str]:
  """The ``*.safetensors`` files of the checkpoint (the shards its index names, else every one).

  Raises:
    FileNotFoundError: none (the message names ``*.bin`` weights, which need converting).
  """
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index, encoding="utf-8") as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    missing = [s for s in shards if not os.path.exists(os.path.join(directory, s))]
    if missing:
      raise FileNotFoundError(f"checkpoint {directory!r}: shard(s) {missing} named by "
                              f"model.safetensors.index.json are missing")
    return [os.path.join(directory, s) for s in shards]
  files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
  if not files:
    other = sorted(f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".pth", ".msgpack", ".h5")))
    hint = (f" (it has {other}: save it again with save_pretrained(..., safe_serialization=True))"
            if other else "")
    raise FileNotFoundError(f"checkpoint {directory!r} has no *.safetensors weights{hint}")
  return [os.path.join(directory, f) for f in files]


def _expected(kind: str, c: DecoderConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...], str]]:
  """``{checkpoint name: (its shape, flax path, how to convert)}`` (``how``: ``"copy"``, ``"t"``
  (transpose: torch ``[out, in]`` to flax ``[in, out]``), ``"qkv"``/``"qkv_bias"`` (GPT-2's fused
  ``c_attn``, split three ways))."""
  d, v, f = c.hidden_size, c.vocab_size, c.intermediate_size
  q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  out: dict[str, tuple[tuple[int, ...], tuple[str, ...], str]] = {}
  if kind == "gpt2":
    out["wte.weight"] = ((v, d), ("embed_tokens", "embedding"), "copy")
    out["wpe.weight"] = ((c.max_positions, d), ("embed_positions", "embedding"), "copy")
    for i in range(c.num_layers):
      p, layer = f"h.{i}.", f"layers_{i}"
      for src, dst in (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm")):
        out[f"{p}{src}.weight"] = ((d,), (layer, dst, "scale"), "copy")
        out[f"{p}{src}.bias"] = ((d,), (layer, dst, "bias"), "copy")
      out[f"{p}attn.c_attn.weight"] = ((d, 3 * d), (layer, "self_attn"), "qkv")
      out[f"{p}attn.c_attn.bias"] = ((3 * d,), (layer, "self_attn"), "qkv_bias")
      out[f"{p}attn.c_proj.weight"] = ((d, d), (layer, "self_attn", "o_proj", "kernel"), "copy")
      out[f"{p}attn.c_proj.bias"] = ((d,), (layer, "self_attn", "o_proj", "bias"), "copy")
      out[f"{p}mlp.c_fc.weight"] = ((d, f), (layer, "mlp", "up_proj", "kernel"), "copy")
      out[f"{p}mlp.c_fc.bias"] = ((f,), (layer, "mlp", "up_proj", "bias"), "copy")
      out[f"{p}mlp.c_proj.weight"] = ((f, d), (layer, "mlp", "down_proj", "kernel"), "copy")
      out[f"{p}mlp.c_proj.bias"] = ((d,), (layer, "mlp", "down_proj", "bias"), "copy")
    out["ln_f.weight"] = ((d,), ("norm", "scale"), "copy")
    out["ln_f.bias"] = ((d,), ("norm", "bias"), "copy")
    return out
  out["model.embed_tokens.weight"] = ((v, d), ("embed_tokens", "embedding"), "copy")
  for i in range(c.num_layers):
    p, layer = f"model.layers.{i}.", f"layers_{i}"
    for name, rows, cols, bias in (("q_proj", q, d, c.qkv_bias), ("k_proj", kv, d, c.qkv_bias),
                                   ("v_proj", kv, d, c.qkv_bias), ("o_proj", d, q, c.out_bias)):
      out[f"{p}self_attn.{name}.weight"] = ((rows, cols), (layer, "self_attn", name, "kernel"), "t")
      if bias:
        out[f"{p}self_attn.{name}.bias"] = ((rows,), (layer, "self_attn", name, "bias"), "copy")
    for name, rows, cols in (("gate_proj", f, d), ("up_proj", f, d), ("down_proj", d, f)):
      out[f"{p}mlp.{name}.weight"] = ((rows, cols), (layer, "mlp", name, "kernel"), "t")
      if c.mlp_bias:
        out[f"{p}mlp.{name}.bias"] = ((rows,), (layer, "mlp", name, "bias"), "copy")
    out[f"{p}input_layernorm.weight"] = ((d,), (layer, "input_layernorm", "scale"), "copy")
    out[f"{p}post_attention_layernorm.weight"] = ((d,), (layer, "post_attention_layernorm", "scale"), "copy")
  out["model.norm.weight"] = ((d,), ("norm", "scale"), "copy")
  if not c.tie_embeddings:
    out["lm_head.weight"] = ((v, d), ("lm_head", "kernel"), "t")
  return out


def _canonical(kind: str, name: str) -> str:
  if kind == "gpt2":
    return name.removeprefix("transformer.")
  return name


def _describe(c: DecoderConfig) -> str:
  return (f"vocab_size={c.vocab_size}, hidden_size={c.hidden_size}, intermediate_size={c.intermediate_size}, "
          f"num_heads={c.num_heads}, num_kv_heads={c.num_kv_heads}, head_dim={c.head_dim}")


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  node = tree
  for name in path[:-1]:
    node = node.setdefault(name, {})
  node[path[-1]] = value


def read_params(directory: str, kind: str, config: DecoderConfig, *, dtype: str = "float32") -> dict:
  """The decoder's parameters from the checkpoint's safetensors files, in ``dtype``.

  Every tensor's shape is checked against ``config`` before any is read.

  Raises:
    FileNotFoundError: no safetensors file (:func:`weight_files`).
    ValueError: a tensor of the wrong shape, a missing tensor or one the architecture does not
      have (each named with the file and the config's sizes).
  """
  from safetensors import safe_open

  expected = _expected(kind, config)
  files = weight_files(directory)
  found: dict[str, tuple[str, str]] = {}    # canonical name -> (file, stored name)
  unexpected = []
  for path in files:
    with safe_open(path, framework="flax") as f:
      for name in f.keys():
        canon = _canonical(kind, name)
        if canon.endswith(_IGNORED_SUFFIXES):
          continue
        if canon == "lm_head.weight" and config.tie_embeddings:
          continue                                   # a tied head saved anyway: the embedding's copy
        if canon not in expected:
          unexpected.append(name)
          continue
        shape = tuple(int(s) for s in f.get_slice(name).get_shape())
        if shape != expected[canon][0]:
          raise ValueError(f"{path}: tensor {name!r} has shape {shape}, but the config ({_describe(config)}) "
                           f"gives {expected[canon][0]}")
        found[canon] = (path, name)
  if unexpected:
    more = " ..." if len(unexpected) > 5 else ""
    raise ValueError(f"checkpoint {directory!r}: tensor(s) {unexpected[:5]}{more} are not part of a {kind} "
                     f"model of this config; is config.json the one of these weights?")
  missing = [n for n in expected if n not in found]
  if missing:
    raise ValueError(f"checkpoint {directory!r}: tensor(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                     f"are missing ({len(missing)} of {len(expected)})")
  target = jnp.dtype(dtype)
  params: dict = {}
  by_file: dict[str, list[str]] = {}
  for canon, (path, _) in found.items():
    by_file.setdefault(path, []).append(canon)
  d = config.hidden_size
  for path, names in by_file.items():
    with safe_open(path, framework="flax") as f:
      for canon in names:
        shape, dst, how = expected[canon]
        t = f.get_tensor(found[canon][1]).astype(target)
        if how == "t":
          _set(params, dst, t.T)
        elif how in ("qkv", "qkv_bias"):
          leaf = "kernel" if how == "qkv" else "bias"
          for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            part = t[:, j * d:(j + 1) * d] if how == "qkv" else t[j * d:(j + 1) * d]
            _set(params, dst + (proj, leaf), part)
        else:
          _set(params, dst, t)
  return params


# ------------------------------------------------------------------------ the tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(directory: str):
  """The checkpoint's tokenizer: ``transformers.AutoTokenizer`` where ``transformers`` is installed
  (chat templates, special tokens), else ``tokenizers.Tokenizer`` of its ``tokenizer.json``;
  ``None`` where the directory has no tokenizer file."""
  if not any(os.path.exists(os.path.join(directory, f)) for f in TOKENIZER_FILES):
    return None
  try:
    from transformers import AutoTokenizer
  except ImportError:
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
      raise ImportError(f"checkpoint {directory!r}: its tokenizer needs transformers (pip install -e "
                        f"\".[llm]\")") from None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)
  return AutoTokenizer.from_pretrained(directory)


# ------------------------------------------------------------------------ entry point
def pretrained_model(directory: str, *, seq_len: int | None = None,
                     remat: bool = False) -> tuple[Model, DecoderConfig]:
  """``(model, config)`` of a checkpoint from its ``config.json`` alone (no weight is read): the
  decoder :func:`load_pretrained` returns, for the shapes a builder checks.

  Raises:
    FileNotFoundError, ValueError: as :func:`load_pretrained` for the directory and its config.
  """
  directory = os.fspath(directory)
  hf = read_config(directory)
  arch, config = decoder_config(hf, where=os.path.join(directory, "config.json"))
  config = dataclasses.replace(config, remat=bool(remat))
  length = int(seq_len) if seq_len is not None else config.max_positions
  if config.positions == "learned" and length > config.max_positions:
    raise ValueError(f"seq_len={length} exceeds the {config.max_positions} learned positions of "
                     f"{directory!r}")
  return decoder_model(config, length), config


def load_pretrained(directory: str, *, seq_len: int | None = None, dtype: str = "float32",
                    remat: bool = False, tokenizer: bool = True) -> Pretrained:
  """A Hugging Face checkpoint as fedtree's decoder and its parameters.

  Args:
    directory: a folder written by ``save_pretrained`` (``config.json``, ``*.safetensors``,
      tokenizer files).
    seq_len: the sequences the model will train on (its ``label_shape``; default the config's
      context, ``max_position_embeddings``).
    dtype: the parameters' dtype, one of :data:`DTYPES` (the compute dtype follows it).
    remat: recompute every layer's activations in the backward pass (``jax.checkpoint``).
    tokenizer: read the tokenizer too (:func:`load_tokenizer`).

  Returns:
    A :class:`Pretrained`; ``model, params = load_pretrained(dir)``.

  Raises:
    FileNotFoundError: no such directory, no ``config.json``, no safetensors weights.
    ValueError: an unsupported architecture or option, a tensor whose shape the config does not
      give, a missing or foreign tensor, an unknown ``dtype``.

  Example:
    >>> import tempfile
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> tiny = tempfile.mkdtemp()
    >>> LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=2, num_attention_heads=4)).save_pretrained(tiny)
    >>> model, params = load_pretrained(tiny)
    >>> model.apply(params, jnp.ones((1, 5), jnp.int32)).shape
    (1, 5, 64)
  """
  if dtype not in DTYPES:
    raise ValueError(f"load_pretrained dtype={dtype!r}; choose one of {DTYPES}")
  directory = os.fspath(directory)
  model, config = pretrained_model(directory, seq_len=seq_len, remat=remat)
  arch = architecture_of(read_config(directory), directory)
  params = read_params(directory, ARCHITECTURES[arch], config, dtype=dtype)
  return Pretrained(model=model, params=params, tokenizer=load_tokenizer(directory) if tokenizer else None,
                    config=config, architecture=arch, directory=directory)
