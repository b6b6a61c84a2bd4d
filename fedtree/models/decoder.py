"""A decoder-only Transformer language model in flax, shaped to hold the weights of the Llama family
(Llama 2/3, Mistral, Qwen2, TinyLlama, SmolLM) and GPT-2 (:func:`fedtree.models.pretrained.load_pretrained`).

:class:`DecoderConfig` names what differs between them: RMSNorm or LayerNorm, a gated (SwiGLU) or a
plain MLP, rotary positions (:class:`RoPE`, with its scaling variants) or learned ones, grouped-query
attention (``num_kv_heads < num_heads``), biases on q/k/v (Qwen2) or everywhere (GPT-2), tied
embeddings, and a sliding attention window per layer (Mistral v0.1, Qwen2 where its config says so).
The computation follows Hugging Face ``transformers``' (``LlamaForCausalLM`` and its kin): the
tests compare logits with it on random checkpoints of every variant.

Every projection is a flax ``nn.Dense`` named as in the Hugging Face checkpoints
(``layers_3/self_attn/q_proj/kernel``, ``layers_3/mlp/down_proj/kernel``, ``lm_head/kernel``), so
LoRA targets read as PEFT's (``q_proj|v_proj``) and the factored adapter forward
(:mod:`fedtree.toolbox.lora`) adds ``(x A) B`` to each of them without forming a per-client kernel.
GPT-2's fused ``c_attn`` is split into ``q_proj``/``k_proj``/``v_proj`` on loading, its ``c_fc`` and
``c_proj`` are ``mlp/up_proj`` and ``mlp/down_proj``, so every architecture has the same names.

Precision: the parameters' dtype is the compute dtype (a bfloat16 base computes in bfloat16); the
norms' statistics, the attention softmax and the rotary tables are float32, as in ``transformers``.
``remat=True`` recomputes every layer's activations in the backward pass (:func:`flax.linen.remat`,
``jax.checkpoint``): activation memory of one layer instead of all.

References:
  Touvron et al. 2023, "Llama 2: open foundation and fine-tuned chat models"; Su et al. 2021,
  "RoFormer: enhanced Transformer with rotary position embedding"; Ainslie et al. 2023, "GQA";
  Radford et al. 2019, "Language models are unsupervised multitask learners" (GPT-2).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.model import Model

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
"""The rotary-position scalings :class:`RoPE` computes (Hugging Face's ``rope_type`` names)."""
NORMS = ("rms", "layer")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")
POSITIONS = ("rope", "learned")


@dataclasses.dataclass(frozen=True)
class RoPE:
  """Rotary position embedding and its scaling (Hugging Face's ``rope_parameters``).

  Attributes:
    theta: the base wavelength (``rope_theta``).
    kind: one of :data:`ROPE_TYPES`: ``default``; ``linear`` (positions divided by ``factor``);
      ``dynamic`` (NTK: the base grows with the sequence length past ``max_positions``);
      ``llama3`` (Llama 3.1's wavelength-dependent division by ``factor``); ``yarn``.
    factor: the scaling factor (``linear``, ``dynamic``, ``llama3``, ``yarn``).
    low_freq_factor: Llama 3.1's (``llama3``).
    high_freq_factor: Llama 3.1's (``llama3``).
    original_max_positions: the pretraining context (``llama3``, ``yarn``).
    beta_fast: YaRN's extrapolation boundary (default 32).
    beta_slow: YaRN's interpolation boundary (default 1).
    attention_factor: YaRN's scale of cos/sin (``None``: ``0.1 ln(factor) + 1``).
    mscale: YaRN's (DeepSeek form of the attention factor, with ``mscale_all_dim``).
    mscale_all_dim: YaRN's.
    truncate: YaRN's rounding of the correction range.
  """

  theta: float = 10000.0
  kind: str = "default"
  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_positions: int | None = None
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float | None = None
  mscale: float | None = None
  mscale_all_dim: float | None = None
  truncate: bool = True

  def __post_init__(self):
    if self.kind not in ROPE_TYPES:
      raise ValueError(f"rope_type={self.kind!r} is not supported; choose one of {ROPE_TYPES}")


def rope_inverse_frequencies(rope: RoPE, head_dim: int, max_positions: int,
                             seq_len: int) -> tuple[np.ndarray, float]:
  """``(inv_freq float32[head_dim // 2], attention factor)`` of ``rope`` for sequences of ``seq_len``
  positions (only ``dynamic`` depends on it), computed in float32 as ``transformers``' rotary
  initializers do (``modeling_rope_utils``)."""
  dim = int(head_dim)
  f32 = np.float32
  exponents = np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)
  base = rope.theta
  if rope.kind == "dynamic":
    length = max(int(seq_len), int(max_positions))
    base = base * ((rope.factor * length / max_positions) - (rope.factor - 1)) ** (dim / (dim - 2))
  inv = (f32(1.0) / (f32(base) ** exponents)).astype(f32)
  if rope.kind == "linear":
    return (inv / f32(rope.factor)).astype(f32), 1.0
  if rope.kind == "llama3":
    old = rope.original_max_positions or max_positions
    low_wavelen, high_wavelen = old / rope.low_freq_factor, old / rope.high_freq_factor
    wavelen = (f32(2 * math.pi) / inv).astype(f32)
    scaled = np.where(wavelen > low_wavelen, inv / f32(rope.factor), inv).astype(f32)
    smooth = ((f32(old) / wavelen - f32(rope.low_freq_factor))
              / f32(rope.high_freq_factor - rope.low_freq_factor)).astype(f32)
    smoothed = ((1 - smooth) * scaled / f32(rope.factor) + smooth * scaled).astype(f32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(f32), 1.0
  if rope.kind == "yarn":
    return _yarn(rope, dim, max_positions)
  return inv, 1.0


def _yarn(rope: RoPE, dim: int, max_positions: int) -> tuple[np.ndarray, float]:
  f32 = np.float32
  original = rope.original_max_positions or max_positions
  factor = rope.factor

  def mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

  attention = rope.attention_factor
  if attention is None:
    attention = (float(mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim))
                 if rope.mscale and rope.mscale_all_dim else mscale(factor))

  def correction_dim(rotations):
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

  low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
  if rope.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001
  pos = (f32(rope.theta) ** (np.arange(0, dim, 2).astype(f32) / f32(dim))).astype(f32)
  extrapolation, interpolation = f32(1.0) / pos, f32(1.0) / (f32(factor) * pos)
  ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
  keep = f32(1) - ramp
  return (interpolation * (1 - keep) + extrapolation * keep).astype(f32), float(attention)


def rope_tables(rope: RoPE, head_dim: int, max_positions: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """``(cos, sin)``, each ``float32[seq_len, head_dim]``: the rotation of every position (both
  halves of a head share a frequency: ``transformers``' ``rotate_half`` layout)."""
  inv, attention = rope_inverse_frequencies(rope, head_dim, max_positions, seq_len)
  freqs = np.arange(seq_len, dtype=np.float32)[:, None] * inv[None, :]
  emb = np.concatenate([freqs, freqs], axis=-1)
  return (np.cos(emb) * np.float32(attention)).astype(np.float32), \
    (np.sin(emb) * np.float32(attention)).astype(np.float32)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """``x [B, T, heads, head_dim]`` rotated: ``x cos + rotate_half(x) sin`` with
  ``rotate_half(x) = [-x2, x1]`` (the halves of the head dimension)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  c, s = cos[None, :, None, :].astype(x.dtype), sin[None, :, None, :].astype(x.dtype)
  return x * c + rotated * s


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """The shape of a decoder (see the module docstring).

  Attributes:
    vocab_size: ``V``, the logits' last axis.
    hidden_size: ``d``.
    num_layers: ``L``.
    num_heads: query heads ``H``.
    num_kv_heads: key/value heads (``H`` for multi-head attention; fewer: grouped-query).
    head_dim: per-head width (``d / H`` in most models).
    intermediate_size: the MLP's hidden width.
    norm: ``"rms"`` (RMSNorm) or ``"layer"`` (LayerNorm with bias).
    norm_eps: the norms' epsilon.
    activation: the MLP's: ``"silu"`` (SwiGLU when gated), ``"gelu"``, ``"gelu_tanh"`` (GPT-2's
      ``gelu_new``), ``"relu"``.
    gated_mlp: ``down(act(gate(x)) * up(x))`` (Llama) or ``down(act(up(x)))`` (GPT-2).
    positions: ``"rope"`` or ``"learned"`` (an embedding table of ``max_positions`` rows).
    max_positions: the context the model was trained for (learned positions' rows; dynamic RoPE's
      threshold).
    rope: the rotary embedding (:class:`RoPE`), with ``positions="rope"``.
    tie_embeddings: the output projection is the token embedding's transpose (no ``lm_head``).
    qkv_bias: biases on q/k/v (Qwen2, GPT-2).
    out_bias: a bias on the attention output (GPT-2).
    mlp_bias: biases in the MLP (GPT-2).
    windows: per layer, the sliding attention window (a key ``k`` is seen from query ``q`` when
      ``q - W < k <= q``) or ``None`` (full causal attention); ``()``: every layer full.
    remat: recompute each layer's activations in the backward pass (``jax.checkpoint``).
  """

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  norm: str = "rms"
  norm_eps: float = 1e-6
  activation: str = "silu"
  gated_mlp: bool = True
  positions: str = "rope"
  max_positions: int = 2048
  rope: RoPE = RoPE()
  tie_embeddings: bool = False
  qkv_bias: bool = False
  out_bias: bool = False
  mlp_bias: bool = False
  windows: tuple[int | None, ...] = ()
  remat: bool = False

  def __post_init__(self):
    for name, value, allowed in (("norm", self.norm, NORMS), ("activation", self.activation, ACTIVATIONS),
                                 ("positions", self.positions, POSITIONS)):
      if value not in allowed:
        raise ValueError(f"DecoderConfig {name}={value!r}; choose one of {allowed}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"DecoderConfig num_heads={self.num_heads} is not a multiple of num_kv_heads="
                       f"{self.num_kv_heads} (grouped-query attention shares each key/value head among a "
                       f"group)")
    if self.windows and len(self.windows) != self.num_layers:
      raise ValueError(f"DecoderConfig windows has {len(self.windows)} entries for {self.num_layers} layers")
    if self.positions == "rope" and self.head_dim % 2:
      raise ValueError(f"DecoderConfig head_dim={self.head_dim} must be even for rotary positions")

  def window(self, layer: int) -> int | None:
    """The sliding window of ``layer`` (``None``: full causal attention)."""
    return self.windows[layer] if self.windows else None

  def parameter_count(self) -> int:
    """Parameters of the model (embeddings, and the output projection unless tied)."""
    d, h, kv, hd = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
    f = self.intermediate_size
    attn = d * h * hd + 2 * d * kv * hd + h * hd * d
    attn += (h * hd + 2 * kv * hd) * self.qkv_bias + d * self.out_bias
    mlp = (3 if self.gated_mlp else 2) * d * f + (f * (1 + self.gated_mlp) + d) * self.mlp_bias
    norms = 2 * d * (2 if self.norm == "layer" else 1)
    embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
    embed += self.max_positions * d * (self.positions == "learned")
    return embed + self.num_layers * (attn + mlp + norms) + d * (2 if self.norm == "layer" else 1)


def _activation(name: str):
  return {"silu": jax.nn.silu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
          "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True), "relu": jax.nn.relu}[name]


class Norm(nn.Module):
  """RMSNorm (``scale``) or LayerNorm (``scale``, ``bias``), statistics in float32."""

  kind: str
  eps: float

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    lead = (1,) * (x.ndim - 1)
    scale = self.param("scale", nn.initializers.ones, (d,)).reshape(lead + (d,))
    x32 = x.astype(jnp.float32)
    if self.kind == "rms":
      y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
      return scale.astype(x.dtype) * y.astype(x.dtype)
    bias = self.param("bias", nn.initializers.zeros, (d,)).reshape(lead + (d,))
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def _dense(features: int, bias: bool, name: str) -> nn.Dense:
  return nn.Dense(features, use_bias=bias, name=name, kernel_init=nn.initializers.normal(0.02))


class Attention(nn.Module):
  """Causal grouped-query attention over ``[B, T, d]`` (optionally windowed)."""

  config: DecoderConfig
  window: int | None

  @nn.compact
  def __call__(self, x: jax.Array, cos, sin) -> jax.Array:
    c = self.config
    b, t, _ = x.shape
    kv, group = c.num_kv_heads, c.num_heads // c.num_kv_heads
    q = _dense(c.num_heads * c.head_dim, c.qkv_bias, "q_proj")(x).reshape(b, t, c.num_heads, c.head_dim)
    k = _dense(kv * c.head_dim, c.qkv_bias, "k_proj")(x).reshape(b, t, kv, c.head_dim)
    v = _dense(kv * c.head_dim, c.qkv_bias, "v_proj")(x).reshape(b, t, kv, c.head_dim)
    if cos is not None:
      q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q = q.reshape(b, t, kv, group, c.head_dim)          # head h = kv * group + g, as transformers' repeat_kv
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k) * jnp.asarray(c.head_dim ** -0.5, q.dtype)
    qi, ki = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = ki <= qi
    if self.window is not None:
      allowed &= ki > qi - int(self.window)
    scores = jnp.where(jnp.asarray(allowed)[None, None, None], scores.astype(jnp.float32),
                       jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, c.num_heads * c.head_dim)
    return _dense(c.hidden_size, c.out_bias, "o_proj")(out)


class MLP(nn.Module):
  """SwiGLU (``gate_proj``, ``up_proj``, ``down_proj``) or a plain MLP (``up_proj``, ``down_proj``)."""

  config: DecoderConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = self.config
    act = _activation(c.activation)
    up = _dense(c.intermediate_size, c.mlp_bias, "up_proj")(x)
    h = act(_dense(c.intermediate_size, c.mlp_bias, "gate_proj")(x)) * up if c.gated_mlp else act(up)
    return _dense(c.hidden_size, c.mlp_bias, "down_proj")(h)


class Block(nn.Module):
  """One pre-norm layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

  config: DecoderConfig
  window: int | None

  @nn.compact
  def __call__(self, x: jax.Array, cos, sin) -> jax.Array:
    c = self.config
    x = x + Attention(c, self.window, name="self_attn")(Norm(c.norm, c.norm_eps, name="input_layernorm")(x),
                                                        cos, sin)
    return x + MLP(c, name="mlp")(Norm(c.norm, c.norm_eps, name="post_attention_layernorm")(x))


class Decoder(nn.Module):
  """Token ids ``int32[B, T]`` to next-token logits ``[B, T, V]`` (see the module docstring)."""

  config: DecoderConfig

  @nn.compact
  def __call__(self, tokens: jax.Array, *, train: bool = False) -> jax.Array:
    c = self.config
    tokens = tokens.astype(jnp.int32)
    t = tokens.shape[-1]
    embed = nn.Embed(c.vocab_size, c.hidden_size, name="embed_tokens",
                     embedding_init=nn.initializers.normal(0.02))
    x = embed(tokens)
    cos = sin = None
    if c.positions == "learned":
      if t > c.max_positions:
        raise ValueError(f"sequences of {t} tokens exceed the model's {c.max_positions} learned positions")
      x = x + nn.Embed(c.max_positions, c.hidden_size, name="embed_positions",
                       embedding_init=nn.initializers.normal(0.01))(jnp.arange(t))[None].astype(x.dtype)
    else:
      cos, sin = rope_tables(c.rope, c.head_dim, c.max_positions, t)
    block = nn.remat(Block, static_argnums=()) if c.remat else Block
    for i in range(c.num_layers):
      x = block(c, c.window(i), name=f"layers_{i}")(x, cos, sin)
    x = Norm(c.norm, c.norm_eps, name="norm")(x)
    if c.tie_embeddings:
      return embed.attend(x)
    return _dense(c.vocab_size, False, "lm_head")(x)


def decoder_model(config: DecoderConfig, seq_len: int) -> Model:
  """:class:`Decoder` as a :class:`~fedtree.core.model.Model` over sequences of ``seq_len`` tokens
  (``input_dtype="int32"``, ``label_shape=(seq_len,)``; ``init(key)`` draws a fresh random model
  of this shape, float32). ``apply(params, tokens)`` takes any ``[B, T]``."""
  module = Decoder(config)
  seq_len = int(seq_len)

  def init(key):
    return module.init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]

  def apply(params, x, *, train: bool = False, rng: jax.Array | None = None):
    return module.apply({"params": params}, x, train=train)

  return Model(init=init, apply=apply, num_classes=int(config.vocab_size), input_dtype="int32",
               label_shape=(seq_len,))


def windows_of(num_layers: int, window: int | None, sliding: Sequence[bool] | None = None) -> tuple:
  """Per-layer windows: ``window`` on the layers ``sliding`` marks (all, when ``None``), ``None``
  elsewhere; ``()`` when no layer slides."""
  if window is None:
    return ()
  marks = [True] * num_layers if sliding is None else [bool(s) for s in sliding]
  out = tuple(int(window) if s else None for s in marks)
  return out if any(w is not None for w in out) else ()
