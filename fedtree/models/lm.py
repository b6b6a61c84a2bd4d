"""Language models for federated next-word prediction (paper 000's task).

Paper 000 (GroupPerFL) trains an LSTM language model: character-aware word embeddings of
size 100 (Kim et al. 2016, "Character-aware neural language models"), 2 layers of 512 units
and a ~33K word vocabulary. :class:`LSTMLM` is that model (``embedding="chars"`` for the
character-aware CNN embedding, ``"table"`` for a plain embedding table); :class:`TransformerLM`
is a small causal Transformer for comparison.

Every model maps token ids ``int32[B, T]`` to next-token logits ``[B, T, V]``; wrapped by
:func:`lm_model` it is a :class:`~fedtree.core.model.Model` with ``input_dtype="int32"`` and
``label_shape=(T,)``, so local training, evaluation and fine-tuning mask padded tokens
(id 0) out of the loss and evaluation reports perplexity (:mod:`fedtree.core.metrics`).

The LSTM cell is written out (:func:`lstm_cell`, gates ``i, f, g, o`` in that order of the
``4H`` axis, forget-gate bias 1) and run with ``lax.scan``, so the reference test compares it
with a hand-written loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.model import Model


def lstm_cell(params: dict, carry: tuple[jax.Array, jax.Array], x: jax.Array):
  """One LSTM step. ``params``: ``w_x [E, 4H]``, ``w_h [H, 4H]``, ``b [4H]``; ``carry = (h, c)``
  each ``[B, H]``; ``x [B, E]``. Returns ``((h, c), h)``."""
  h, c = carry
  z = x @ params["w_x"] + h @ params["w_h"] + params["b"][None]
  i, f, g, o = jnp.split(z, 4, axis=-1)
  c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
  h = jax.nn.sigmoid(o) * jnp.tanh(c)
  return (h, c), h


class LSTMLayer(nn.Module):
  """One LSTM layer over ``[B, T, E]`` (zero initial state), returns ``[B, T, H]``."""

  hidden: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    e, h = x.shape[-1], self.hidden
    init = nn.initializers.lecun_normal()
    params = {
      "w_x": self.param("w_x", init, (e, 4 * h)),
      "w_h": self.param("w_h", nn.initializers.orthogonal(), (h, 4 * h)),
      "b": self.param("b", lambda _, s: jnp.zeros(s).at[h:2 * h].set(1.0), (4 * h,)),
    }
    params = jax.tree.map(lambda p: p.astype(x.dtype), params)
    zeros = jnp.zeros((x.shape[0], h), x.dtype)
    _, ys = jax.lax.scan(lambda carry, xt: lstm_cell(params, carry, xt), (zeros, zeros),
                         jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(ys, 0, 1)


class CharCNNEmbed(nn.Module):
  """Character-aware word embedding (Kim et al. 2016): each word's characters are embedded,
  convolved with filters of several widths, max-pooled over the word, passed through a
  highway layer and projected to ``features``.

  ``char_ids`` is the static ``int32[V, L]`` spelling of every vocabulary word (0 = no
  character; :meth:`fedtree.datasets.text.Vocabulary.char_table`). Convolutions are shifted
  products summed (no convolution op; see :class:`fedtree.models.classifiers.Conv`).
  """

  char_ids: tuple[tuple[int, ...], ...]
  features: int = 100
  char_dim: int = 15
  filters: tuple[tuple[int, int], ...] = ((1, 25), (2, 50), (3, 75), (4, 100))

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    host = np.asarray(self.char_ids, np.int32)
    num_chars = int(host.max()) + 1          # on the host: the table is static, also under jit
    table = jnp.asarray(host)
    chars = table[tokens]                                           # [..., L]
    e = nn.Embed(num_chars, self.char_dim, name="chars")(chars)     # [..., L, D]
    e = e * (chars > 0)[..., None].astype(e.dtype)
    length = chars.shape[-1]
    pooled = []
    for width, count in self.filters:
      w = min(width, length)
      windows = jnp.concatenate([e[..., i:length - w + 1 + i, :] for i in range(w)], axis=-1)
      conv = nn.Dense(count, name=f"conv{width}")(windows)          # [..., L-w+1, count]
      pooled.append(jnp.max(jnp.tanh(conv), axis=-2))
    y = jnp.concatenate(pooled, axis=-1)
    gate = nn.sigmoid(nn.Dense(y.shape[-1], name="highway_gate",
                               bias_init=nn.initializers.constant(-2.0))(y))
    y = gate * nn.relu(nn.Dense(y.shape[-1], name="highway")(y)) + (1 - gate) * y
    return nn.Dense(self.features, name="project")(y)


class LSTMLM(nn.Module):
  """LSTM language model: embedding, ``layers`` LSTM layers of ``hidden`` units, with
  ``projection`` a dense layer to that many units (no activation), a dense output over the
  vocabulary. Paper 000: ``embed=100, hidden=512, layers=2`` with ``embedding="chars"``; the
  standard tasks' models are :data:`NAMED_LMS`."""

  vocab_size: int
  embed: int = 100
  hidden: int = 512
  layers: int = 2
  embedding: str = "table"
  char_ids: tuple[tuple[int, ...], ...] | None = None
  dropout: float = 0.0
  projection: int | None = None

  @nn.compact
  def __call__(self, tokens: jax.Array, *, train: bool = False) -> jax.Array:
    tokens = tokens.astype(jnp.int32)
    if self.embedding == "chars":
      x = CharCNNEmbed(self.char_ids, features=self.embed, name="char_embed")(tokens)
    else:
      x = nn.Embed(self.vocab_size, self.embed, name="embed")(tokens)
    for i in range(self.layers):
      x = nn.Dropout(self.dropout, deterministic=not train)(x)
      x = LSTMLayer(self.hidden, name=f"lstm{i}")(x)
    x = nn.Dropout(self.dropout, deterministic=not train)(x)
    if self.projection:
      x = nn.Dense(int(self.projection), name="projection")(x)
    return nn.Dense(self.vocab_size, name="out")(x)


class TransformerLM(nn.Module):
  """A small causal (decoder-only, pre-LayerNorm) Transformer language model with learned
  positions."""

  vocab_size: int
  max_len: int
  dim: int = 64
  depth: int = 2
  heads: int = 4
  mlp_dim: int = 128
  dropout: float = 0.0

  @nn.compact
  def __call__(self, tokens: jax.Array, *, train: bool = False) -> jax.Array:
    tokens = tokens.astype(jnp.int32)
    t = tokens.shape[-1]
    x = nn.Embed(self.vocab_size, self.dim, name="embed")(tokens)
    x = x + self.param("pos", nn.initializers.normal(0.02), (self.max_len, self.dim))[None, :t]
    mask = nn.make_causal_mask(tokens)
    for i in range(self.depth):
      y = nn.LayerNorm(name=f"ln_a{i}")(x)
      y = nn.MultiHeadDotProductAttention(num_heads=self.heads, name=f"attn{i}",
                                          deterministic=True)(y, y, mask=mask)
      x = x + nn.Dropout(self.dropout, deterministic=not train)(y)
      y = nn.LayerNorm(name=f"ln_m{i}")(x)
      y = nn.Dense(self.dim, name=f"mlp_out{i}")(nn.gelu(nn.Dense(self.mlp_dim, name=f"mlp_in{i}")(y)))
      x = x + nn.Dropout(self.dropout, deterministic=not train)(y)
    return nn.Dense(self.vocab_size, name="out")(nn.LayerNorm(name="ln_f")(x))


LM_EMBEDDINGS = ("table", "chars")

NAMED_LMS: dict[str, dict] = {
  "shakespeare_lstm": dict(embed=8, hidden=256, layers=2),
  "stackoverflow_lstm": dict(embed=96, hidden=670, layers=1, projection=96),
}
"""The standard tasks' language models, :class:`LSTMLM` at their published sizes (a config's
``model`` fields override them):

* ``shakespeare_lstm``: the character LSTM of McMahan et al. 2017 as LEAF
  (TalwalkarLab/leaf ``models/shakespeare/stacked_lstm.py``) and Reddi et al. 2021
  (google-research/federated ``utils/models/shakespeare_models.py``) build it: ``embedding 8 -
  LSTM 256 - LSTM 256 - dense vocabulary``. Parameters ``8 V + 271,360 + 525,312 + 257 V``:
  820,522 for TFF Shakespeare's vocabulary of 86 characters + 4 special tokens (V = 90) and
  817,872 for LEAF's 80 characters (LEAF predicts one next character per 80-character window, from
  the last LSTM output; fedtree predicts every position's next character, as TFF does).
* ``stackoverflow_lstm``: the Stack Overflow next-word model of Reddi et al. 2021
  (google-research/federated ``utils/models/stackoverflow_models.py:create_recurrent_model`` with
  its defaults): ``embedding 96 - LSTM 670 - dense 96 (the projection) - dense vocabulary``.
  Parameters ``96 V + 2,055,560 + 64,416 + 97 V``: 4,050,748 for 10,000 words + 4 special tokens
  (V = 10,004; the reference's pad, BOS, EOS and one OOV bucket, fedtree's
  :data:`fedtree.datasets.text.SPECIAL`).
"""


def lm_model(module: nn.Module, seq_len: int, vocab_size: int) -> Model:
  """Wraps a flax LM taking ``int32[B, seq_len]`` into a :class:`Model` (labels ``[B, T]``)."""
  seq_len = int(seq_len)

  def init(key):
    return module.init(key, jnp.zeros((1, seq_len), jnp.int32), train=False)["params"]

  def apply(params, x, *, train: bool = False, rng: jax.Array | None = None):
    rngs = {"dropout": rng} if (train and rng is not None) else None
    return module.apply({"params": params}, x, train=train, rngs=rngs)

  return Model(init=init, apply=apply, num_classes=int(vocab_size), input_dtype="int32",
               label_shape=(seq_len,))


def build_lm(name: str, *, example_shape: Sequence[int], num_classes: int, **kwargs) -> Model:
  """``lstm_lm`` (``embed=``, ``hidden=``, ``layers=``, ``embedding=``, ``char_ids=``,
  ``dropout=``, ``projection=``), one of :data:`NAMED_LMS` (``lstm_lm`` at a published size) or
  ``transformer_lm`` (``dim=``, ``depth=``, ``heads=``, ``mlp_dim=``, ``dropout=``) over a
  vocabulary of ``num_classes`` words and sentences of ``example_shape = (T,)`` tokens.

  Raises:
    ValueError: the example shape is not ``(T,)``, the embedding is unknown, or a
      ``vocab_size`` given in ``kwargs`` differs from the data's vocabulary (``num_classes``).
  """
  example_shape = tuple(int(s) for s in example_shape)
  if len(example_shape) != 1:
    raise ValueError(f"model {name!r} takes sentences of T token ids, example_shape=(T,); the data's "
                     f"examples have shape {example_shape}")
  if name in NAMED_LMS:
    kwargs = {**NAMED_LMS[name], **kwargs}
    name = "lstm_lm"
  vocab = kwargs.pop("vocab_size", None)
  if vocab is not None and int(vocab) != int(num_classes):
    raise ValueError(f"model vocab_size={vocab} but the data's vocabulary has {num_classes} words; "
                     "drop model.vocab_size or rebuild the data with the same vocabulary")
  if name == "lstm_lm":
    embedding = kwargs.get("embedding", "table")
    if embedding not in LM_EMBEDDINGS:
      raise ValueError(f"lstm_lm embedding={embedding!r}; choose one of {LM_EMBEDDINGS}")
    if embedding == "chars":
      chars = kwargs.get("char_ids")
      if chars is None or len(chars) != int(num_classes):
        raise ValueError(f"embedding='chars' needs char_ids with one row per word ({num_classes}), "
                         f"got {None if chars is None else len(chars)}")
      kwargs["char_ids"] = tuple(tuple(int(c) for c in row) for row in np.asarray(chars))
    module = LSTMLM(vocab_size=int(num_classes), **kwargs)
  elif name == "transformer_lm":
    module = TransformerLM(vocab_size=int(num_classes), max_len=example_shape[0], **kwargs)
  else:
    raise ValueError(f"language model {name!r} is unknown; choose 'lstm_lm', 'transformer_lm' or one of "
                     f"{tuple(NAMED_LMS)}")
  return lm_model(module, example_shape[0], num_classes)
