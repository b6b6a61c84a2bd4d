"""The cohort as a batch over one frozen base (issue 50, priority 2): a decoder's LoRA adapters for every
sampled client trained in one jitted round through the one shared base, stored in bfloat16 or int8.

No transformers needed: the base is a random :class:`fedtree.models.decoder.Decoder` (its equality with
transformers is tests/test_pretrained.py's).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import close, count_traces

from fedtree.algorithms import fedavg
from fedtree.core import loop
from fedtree.core.data import from_client_arrays
from fedtree.core.local import LocalSchedule
from fedtree.core.model import masked_cross_entropy
from fedtree.models.decoder import DecoderConfig, decoder_model
from fedtree.toolbox import lora as L
from fedtree.toolbox.quantize import (
  Int8Weight,
  dequantize,
  error_bound,
  quantize_int8,
  store_base,
  stored_bytes,
)

TARGETS = r"(q_proj|v_proj|down_proj)/kernel$"


def _decoder(d=32, layers=2, vocab=64, ff=48, seq=8, **kw):
  """A random decoder (GQA: 4 heads over 2 key/value heads), its ``init`` jitted."""
  config = DecoderConfig(vocab_size=vocab, hidden_size=d, num_layers=layers, num_heads=4, num_kv_heads=2,
                         head_dim=d // 4, intermediate_size=ff, max_positions=seq, **kw)
  model = decoder_model(config, seq)
  return model._replace(init=jax.jit(model.init))


def _tokens(clients=3, m=4, t=8, vocab=64, seed=0):
  """Per-client right-padded sequences: ``x`` tokens, ``y`` the next token (0 where padded)."""
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in range(clients):
    n = m - (c % 2)
    seqs = rng.integers(1, vocab, (n, t + 1)).astype(np.int32)
    lengths = rng.integers(t // 2, t + 1, n)
    for s, ln in zip(seqs, lengths, strict=True):
      s[ln:] = 0
    train.append((seqs[:, :t], seqs[:, 1:]))
    test.append((seqs[:1, :t], seqs[:1, 1:]))
  return from_client_arrays(train, test, num_classes=vocab, dtype=np.int32)


def test_int8_weights_are_within_half_a_step_of_the_floats():
  """Per-output-channel absmax int8: every entry within ``scale / 2`` of the float weight (the
  bound, up to float32 rounding of the product), the scale ``max |W| / 127`` of its column (of its
  row for an embedding table), zero columns exact; ``store_base`` quantizes the matrices only and
  keeps about a quarter of the float32 bytes."""
  rng = np.random.default_rng(0)
  w = rng.standard_normal((64, 48)).astype(np.float32) * rng.uniform(0.01, 3.0, 48).astype(np.float32)
  w[:, 5] = 0.0
  q = quantize_int8(w, dtype="float32")
  assert q.q.dtype == jnp.int8 and q.scale.shape == (1, 48)
  deq = np.asarray(q.dequantize())
  bound = np.asarray(error_bound(q))
  assert np.all(np.abs(deq - w) <= bound * (1 + 1e-6) + 1e-7)
  np.testing.assert_allclose(np.asarray(q.scale)[0, w.any(0)], np.abs(w).max(0)[w.any(0)] / 127, rtol=1e-6)
  assert np.all(deq[:, 5] == 0)
  assert (np.abs(deq - w) / bound).max() > 0.9          # the bound is reached: it is the scheme's
  rows = quantize_int8(w, per_row=True, dtype="float32")
  assert rows.scale.shape == (64, 1)
  err = np.abs(np.asarray(rows.dequantize()) - w)
  assert np.all(err <= np.asarray(error_bound(rows)) * (1 + 1e-6) + 1e-7)
  model = _decoder()
  base = model.init(jax.random.key(0))
  stored = store_base(base, "int8")
  leaves = jax.tree.leaves(stored, is_leaf=lambda a: isinstance(a, Int8Weight))
  assert {type(a).__name__ for a in leaves} == {"Int8Weight", "ArrayImpl"}
  assert isinstance(stored["embed_tokens"]["embedding"], Int8Weight)
  assert stored["embed_tokens"]["embedding"].scale.shape == (64, 1)           # per token
  assert stored["layers_0"]["self_attn"]["q_proj"]["kernel"].scale.shape == (1, 32)   # per output column
  assert stored["norm"]["scale"].dtype == jnp.bfloat16
  assert 0.25 < stored_bytes(stored) / stored_bytes(base) < 0.3
  assert stored_bytes(store_base(base, "bfloat16")) * 2 == stored_bytes(base)
  with pytest.raises(ValueError, match=r"base dtype='int4'; choose one of \('float32', 'bfloat16', 'int8'\)"):
    store_base(base, "int4")


def _round(model, base, data, cohort, base_dtype=None, batch_size=2):
  return L.frozen_base(lambda m: fedavg(model=m, data=data, local_optimizer=optax.adam(1e-3),
                                        schedule=LocalSchedule(batch_size=batch_size, steps=2),
                                        cohort_size=cohort, chunk_size=None),
                       model=model, spec=L.lora(rank=2, targets=TARGETS), base=store_base(base, base_dtype))


def _no_kernel_per_client(text, base, cohort):
  for path, leaf in zip(L.param_paths(base), jax.tree.leaves(base), strict=True):
    if leaf.ndim == 2:
      shape = "x".join(map(str, leaf.shape))
      assert not re.search(rf"tensor<{cohort}x{shape}x", text), (path, cohort)


def test_every_clients_step_runs_through_one_base():
  """One round of 3 clients on an int8 base: no array of the program has a base matrix per client (no
  ``[K, d_in, d_out]`` in its types), adapters and optimizer states are float32 masters beside the
  stored int8 base, the layers compute in bfloat16, and two rounds compile once."""
  model = _decoder(layers=1)
  base = model.init(jax.random.key(0))
  data = _tokens(clients=4)
  alg = _round(model, base, data, 3, "int8")
  state = alg.init(jax.random.key(0))
  text = jax.jit(loop.make_multi_round(alg, 1)).lower(state, data, jax.random.key(1)).as_text()
  _no_kernel_per_client(text, base, 3)
  assert re.search(r"dot_general.*-> tensor<[0-9x]*xbf16>", text)      # the layers compute in bfloat16
  assert state.base["layers_0"]["self_attn"]["q_proj"]["kernel"].q.dtype == jnp.int8
  assert {a.dtype for a in jax.tree.leaves(state.inner.params)} == {jnp.dtype(jnp.float32)}
  assert {a.dtype for a in jax.tree.leaves(state.inner.opt_state) if a.ndim} <= {jnp.dtype(jnp.float32)}
  counted, traces = count_traces(alg)
  out = loop.run(counted, data, num_rounds=2, key=jax.random.key(2))
  assert len(traces) == 1 and int(out.round) == 2
  moved = alg.models(out)["global"].params["layers_0"]["self_attn"]["q_proj"]["kernel"]["b"]
  assert float(jnp.max(jnp.abs(moved))) > 0


@pytest.mark.slow
@pytest.mark.parametrize("base_dtype", ["bfloat16", "int8"])
def test_compiled_memory_grows_with_the_cohort_by_less_than_one_base(base_dtype):
  """The compiled round's temporaries grow from 2 to 6 clients by less than one (expanded, bfloat16)
  base: adapters, optimizer states and activations per client, never a base per client (which would
  add four). Measured on a 2-layer d=256 decoder (2.5 MB in bfloat16) with one sequence per step;
  ~40 s of compiling on the 2-core CPU."""
  model = _decoder(d=256, ff=512, vocab=128)
  base = model.init(jax.random.key(0))
  data = _tokens(clients=6, vocab=128)
  temps = {}
  for cohort in (2, 6):
    alg = _round(model, base, data, cohort, base_dtype, batch_size=1)
    state = alg.init(jax.random.key(0))
    lowered = jax.jit(loop.make_multi_round(alg, 1)).lower(state, data, jax.random.key(1))
    _no_kernel_per_client(lowered.as_text(), base, cohort)
    temps[cohort] = lowered.compile().memory_analysis().temp_size_in_bytes
  expanded = stored_bytes(store_base(base, "bfloat16"))
  assert temps[6] - temps[2] < expanded, (temps, expanded)


def test_quantized_base_computes_the_dequantized_model():
  """Adapters on an int8 base give the logits of the same adapters on the dequantized (bfloat16)
  base written out, and the base's logits are within a few per cent of the float32 model's
  (measured: 1.3 % of their largest magnitude, against 0.6 % for a bfloat16 base)."""
  model = _decoder()
  base = model.init(jax.random.key(0))
  spec = L.lora(rank=2, targets=TARGETS)
  stored = store_base(base, "int8")
  adapted = L.adapted_model(model, spec, stored)
  fresh = adapted.init(jax.random.key(1))
  x = jnp.asarray(_tokens().x_train[0])
  for ads in (fresh, jax.tree.map(lambda a: a + 0.1, fresh)):   # B = 0, and B nonzero
    out = jax.jit(adapted.apply)(ads, x)
    ref = jax.jit(L.adapted_model(model, spec, dequantize(stored)).apply)(ads, x)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
  full = np.asarray(jax.jit(L.adapted_model(model, spec, base).apply)(fresh, x))
  out = np.asarray(jax.jit(adapted.apply)(fresh, x), np.float32)
  assert np.abs(out - full).max() < 0.05 * np.abs(full).max()


def test_right_padding_is_invisible_and_untrained():
  """Right-padded sequences: the logits of the real positions do not depend on what the padding
  holds (causal attention), and the loss counts real next tokens only (label 0 is padding)."""
  model = _decoder()
  base = model.init(jax.random.key(0))
  x = np.asarray(_tokens().x_train[0])
  other = x.copy()
  other[:, 6:] = 7
  a, b = (np.asarray(jax.jit(model.apply)(base, jnp.asarray(v))) for v in (x, other))
  np.testing.assert_array_equal(a[:, :6], b[:, :6])
  y = np.asarray(_tokens().y_train[0])
  mask = jnp.ones((y.shape[0],), bool)
  logits = jax.jit(model.apply)(base, jnp.asarray(x))
  loss = float(masked_cross_entropy(logits, jnp.asarray(y), mask))
  logp = jax.nn.log_softmax(np.asarray(logits, np.float64))
  real = y > 0
  expect = -np.take_along_axis(np.asarray(logp), y[..., None], -1)[..., 0][real].mean()
  assert abs(loss - expect) < 1e-5


def test_batched_adapters_match_a_per_client_loop():
  """FedAvg of decoder adapters, every client one batched round through the shared base, equals a
  plain per-client loop: each client's 2 full-batch SGD steps from the global adapters, alone, then
  the example-weighted mean (float32 base, factored forward)."""
  model = _decoder()
  base = model.init(jax.random.key(0))
  data = _tokens(clients=3)
  spec = L.lora(rank=2, alpha=4.0, targets=TARGETS)
  lr, steps, batch = 0.5, 2, int(data.max_train)
  schedule = LocalSchedule(batch_size=batch, steps=steps, batch_order="fixed")
  alg = L.frozen_base(lambda m: fedavg(model=m, data=data, local_optimizer=optax.sgd(lr), schedule=schedule),
                      model=model, spec=spec, base=base)
  state = loop.run(alg, data, num_rounds=1, key=jax.random.key(5))
  start = jax.tree.map(lambda a: a[0], alg.init(loop.init_key(jax.random.key(5))).inner.params[0])
  adapted = L.adapted_model(model, spec, base)

  @jax.jit
  def grad(a, x, y, mask):
    return jax.grad(lambda a: masked_cross_entropy(adapted.apply(a, x), y, mask))(a)

  sent, weights = [], []
  for c in range(data.num_clients):
    n = int(data.n_train[c])
    mask = jnp.arange(data.x_train.shape[1]) < n
    a = start
    for _ in range(steps):
      a = jax.tree.map(lambda p, g: p - lr * g, a, grad(a, data.x_train[c], data.y_train[c], mask))
    sent.append(a)
    weights.append(n)
  w = np.asarray(weights, np.float64) / np.sum(weights)
  mean = jax.tree.map(lambda *xs: sum(wi * np.asarray(xi, np.float64) for wi, xi in zip(w, xs, strict=True)),
                      *sent)
  close(jax.tree.map(lambda a: a[0], alg.models(state)["global"].params), mean, tol=2e-5)
