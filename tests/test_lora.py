"""LoRA adapters on a frozen, shared base (fedtree.toolbox.lora; issue 26)."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import close, trees_equal

from fedtree.algorithms import fedavg
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.model import from_flax, masked_cross_entropy
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model
from fedtree.objectives import ditto_update
from fedtree.toolbox import lora as L


def _lms():
  """A tiny Transformer LM (3-d attention kernels) and a tiny LSTM LM (``w_x``, ``w_h``)."""
  tf = build_model("transformer_lm", example_shape=(6,), num_classes=11, dim=8, depth=1, heads=2,
                   mlp_dim=16)
  lstm = build_model("lstm_lm", example_shape=(6,), num_classes=11, embed=4, hidden=8, layers=2)
  return {"transformer": tf, "lstm": lstm}


def _random_adapters(spec, base, key):
  """Adapters with B random too (fresh ones have B = 0, which would hide a wrong merge)."""
  ad = L.init_adapters(spec, base, key)
  leaves, tree = jax.tree.flatten(ad)
  keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
  return jax.tree.unflatten(
    tree, [0.3 * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves, strict=True)])


@pytest.mark.parametrize("name", ["transformer", "lstm"])
def test_zero_b_equals_base_and_merge_gives_the_same_logits(name):
  """Fresh adapters (B = 0) leave the LM's logits exactly the base's; every kernel the default
  pattern selects gets ``A [d_in, r]``, ``B [r, d_out]`` and nothing else gets an adapter."""
  model = _lms()[name]
  base = model.init(jax.random.key(0))
  spec = L.lora(rank=3, alpha=6.0)
  adapted = L.adapted_model(model, spec, base)
  ad = jax.jit(adapted.init)(jax.random.key(1))
  x = jax.random.randint(jax.random.key(2), (4, 6), 1, 11)
  np.testing.assert_array_equal(np.asarray(jax.jit(adapted.apply)(ad, x)),
                                np.asarray(jax.jit(model.apply)(base, x)))
  paths = L.param_paths(base)
  expected = {p for p in paths if re.search(r"kernel$|(^|/)w_[xh]$", p)}
  assert {p.rsplit("/", 1)[0] for p in L.param_paths(ad)} == expected
  if name == "transformer":
    assert "attn0/query/kernel" in expected and "attn0/out/kernel" in expected
    q = ad["attn0"]["query"]["kernel"]          # [d, h, k] as [d, h*k]
    o = ad["attn0"]["out"]["kernel"]            # [h, k, d] as [h*k, d]
    assert q["a"].shape == (8, 3) and q["b"].shape == (3, 8)
    assert o["a"].shape == (8, 3) and o["b"].shape == (3, 8)
  else:
    assert {"lstm0/w_x", "lstm0/w_h", "lstm1/w_h", "out/kernel"} <= expected
    assert ad["lstm1"]["w_h"]["a"].shape == (8, 3) and ad["lstm1"]["w_h"]["b"].shape == (3, 32)
  # Merging (random, nonzero) adapters into the base gives a plain model with the adapted
  # logits; the merged kernels differ from the base exactly where adapters are.
  ad = _random_adapters(spec, base, jax.random.key(3))
  merged = L.merge(spec, base, ad)
  close(jax.jit(model.apply)(merged, x), jax.jit(adapted.apply)(ad, x), tol=1e-5)
  changed = {p for p, a, b in zip(paths, jax.tree.leaves(base), jax.tree.leaves(merged), strict=True)
             if not np.array_equal(a, b)}
  assert changed == expected


@pytest.mark.parametrize("name", ["transformer", "lstm"])
def test_factored_and_merged_forwards_agree(name):
  """The factored forward (adapters added to the outputs of the flax dense layers that use
  the kernels) gives the merged model's logits and gradients; it factors exactly the kernels
  a Dense/DenseGeneral uses (all of the Transformer's; the LSTM's output layer, its ``w_x``/
  ``w_h`` are merged)."""
  model = _lms()[name]
  base = model.init(jax.random.key(0))
  x = jax.random.randint(jax.random.key(2), (4, 6), 1, 11)
  y = jax.random.randint(jax.random.key(4), (4, 6), 1, 11)
  factored, merged = (L.adapted_model(model, L.lora(rank=3, alpha=6.0, forward=f), base)
                      for f in ("factored", "merged"))
  spec = L.lora(rank=3, alpha=6.0)
  kernels = L.factored_kernels(model, spec, base, x)
  if name == "transformer":
    assert kernels == {"attn0/query/kernel": 1, "attn0/key/kernel": 1, "attn0/value/kernel": 1,
                       "attn0/out/kernel": 2, "mlp_in0/kernel": 1, "mlp_out0/kernel": 1, "out/kernel": 1}
  else:
    assert kernels == {"out/kernel": 1}
  ad = _random_adapters(spec, base, jax.random.key(3))
  close(jax.jit(factored.apply)(ad, x), jax.jit(merged.apply)(ad, x), tol=1e-5)
  mask = jnp.ones((4,), bool)

  def grad(m):
    return jax.jit(jax.grad(lambda a: masked_cross_entropy(m.apply(a, x), y, mask)))(ad)

  close(grad(factored), grad(merged), tol=1e-5)


def test_the_factored_forward_forms_no_kernel_per_client():
  """Under ``vmap`` over clients' adapters, the merged forward builds a ``[C, d_in, d_out]``
  kernel (and its gradient) per client; the factored one multiplies every client's inputs by
  the one shared kernel and never forms one (checked in the lowered program's types)."""
  model = _lms()["transformer"]
  base = model.init(jax.random.key(0))
  x = jax.random.randint(jax.random.key(2), (3, 4, 6), 1, 11)

  def program(forward):
    adapted = L.adapted_model(model, L.lora(rank=2, forward=forward), base)
    ads = jax.vmap(adapted.init)(jax.random.split(jax.random.key(1), 3))
    loss = lambda a, xx: masked_cross_entropy(adapted.apply(a, xx), xx, jnp.ones((4,), bool))  # noqa: E731
    return jax.jit(jax.vmap(jax.grad(loss))).lower(ads, x).as_text()

  per_client = ("tensor<3x8x16xf32>", "tensor<3x16x8xf32>", "tensor<3x8x11xf32>")  # mlp_in/out, out
  merged, factored = program("merged"), program("factored")
  assert all(t in merged for t in per_client)
  assert not any(t in factored for t in per_client)


def test_matrix_split():
  assert L.matrix_split((5, 7)) == 1
  assert L.matrix_split((64, 4, 16)) == 1     # attention query/key/value: [d, h*k]
  assert L.matrix_split((4, 16, 64)) == 2     # attention out: [h*k, d]
  assert L.matrix_split((3, 3, 8, 16)) == 3   # conv [kh, kw, C, F]: [kh*kw*C, F]


def test_adapted_mlp_equals_a_factored_forward():
  """The merged model's logits equal LoRA's factored forward written out by hand,
  ``x W + (alpha/r) (x A) B + b`` per layer, with random (nonzero) A and B."""
  model = build_model("mlp", example_shape=(5,), num_classes=3, hidden=(7,))
  base = model.init(jax.random.key(0))
  spec = L.lora(rank=2, alpha=3.0, targets="kernel")
  ad = _random_adapters(spec, base, jax.random.key(1))
  x = np.asarray(jax.random.normal(jax.random.key(2), (4, 5)), np.float64)
  s = 3.0 / 2

  def layer(h, name):
    w, b = (np.asarray(base[name][k], np.float64) for k in ("kernel", "bias"))
    a, bb = (np.asarray(ad[name]["kernel"][k], np.float64) for k in ("a", "b"))
    return h @ w + s * (h @ a) @ bb + b

  ref = layer(np.maximum(layer(x, "Dense_0"), 0.0), "Dense_1")
  np.testing.assert_allclose(np.asarray(L.adapted_model(model, spec, base).apply(ad, x)), ref,
                             rtol=1e-5, atol=1e-5)


def _problem():
  data, groups = grouped_synthetic(group_sizes=(3, 3), dim=6, num_classes=3, seed=1)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
  return data, groups, model, model.init(jax.random.key(0))


def test_training_changes_adapters_only_and_the_base_is_bitwise_unchanged():
  """Two FedAvg rounds of adapters: the base in the state is bitwise the base given (and the
  caller's copy is not deleted by the loop's buffer donation); the adapters moved."""
  data, _, model, base = _problem()
  keep = jax.tree.map(np.asarray, base)
  # sgd(0.1) diverges on this problem (loss 42 in round 1, NaN in round 2): the divergence check
  # now stops it, so a rate that trains
  alg = L.frozen_base(lambda m: fedavg(model=m, data=data, local_optimizer=optax.sgd(0.01),
                                       schedule=LocalSchedule(batch_size=8, steps=3)),
                      model=model, spec=L.lora(rank=2), base=base)
  state = loop.run(alg, data, num_rounds=2, key=jax.random.key(1))
  trees_equal(state.base, keep)
  trees_equal(base, keep)
  b = alg.models(state)["global"].params["Dense_0"]["kernel"]["b"]
  assert float(jnp.max(jnp.abs(b))) > 1e-4


def test_the_base_is_an_argument_of_the_round_not_a_constant():
  """The compiled round takes the base as an input: no constant in its program is anywhere
  near the base's size (JAX 0.10 embeds closed-over arrays as literals), and the program text
  does not grow with the base."""
  data, _, _, _ = _problem()
  sizes = {}
  for hidden in (16, 256):
    model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(hidden, hidden))
    base = model.init(jax.random.key(0))
    alg = L.frozen_base(lambda m: fedavg(model=m, data=data, local_optimizer=optax.sgd(0.5),
                                         schedule=LocalSchedule(batch_size=8, steps=1)),
                        model=model, spec=L.lora(rank=2), base=base)
    state = alg.init(jax.random.key(0))
    text = jax.jit(loop.make_multi_round(alg, 1)).lower(state, data, jax.random.key(1)).as_text()
    sizes[hidden] = len(text)
    literals = [len(m) for m in re.findall(r'dense<"0x([0-9A-F]*)"', text)]
    assert max(literals, default=0) // 2 < 1024, max(literals) // 2   # < 1 KB each
  base_growth = 4 * (256 * 256 - 16 * 16)
  assert sizes[256] - sizes[16] < base_growth / 10, sizes


def test_personal_adapters_match_a_per_client_loop():
  """Ditto (lambda = 0) with adapters: every client's persistent personal adapter after a round
  equals two full-batch gradient steps of that client alone from the initial adapter, by a
  plain per-client loop; the global adapter is the example-weighted mean of the clients'
  (FedAvg). The per-client state holds adapters only, the base once."""
  data, _, model, base = _problem()
  spec = L.lora(rank=2, alpha=2.0)
  lr, steps, batch = 0.5, 2, int(data.max_train)
  schedule = LocalSchedule(batch_size=batch, steps=steps, batch_order="fixed")

  def build(m):
    upd = ditto_update(m, optax.sgd(lr), lam=0.0, batch_size=batch, max_steps=steps)
    return fedavg(model=m, data=data, local_optimizer=optax.sgd(lr), schedule=schedule,
                  client_update=upd)

  alg = L.frozen_base(build, model=model, spec=spec, base=base)
  state = loop.run(alg, data, num_rounds=1, key=jax.random.key(5))
  start = alg.init(loop.init_key(jax.random.key(5))).inner.params[0]
  start = jax.tree.map(lambda a: a[0], start)
  adapted = L.adapted_model(model, spec, base)
  personal = alg.models(state)["personal"].params
  sent, weights = [], []

  @jax.jit
  def grad(a, x, y, mask):
    return jax.grad(lambda a: masked_cross_entropy(adapted.apply(a, x), y, mask))(a)

  for c in range(data.num_clients):
    n = int(data.n_train[c])
    mask = jnp.arange(data.x_train.shape[1]) < n
    a = start
    for _ in range(steps):
      a = jax.tree.map(lambda p, g: p - lr * g, a, grad(a, data.x_train[c], data.y_train[c], mask))
    close(jax.tree.map(lambda p, c=c: p[c], personal), a, tol=2e-5)
    sent.append(a)
    weights.append(n)
  w = np.asarray(weights, np.float64) / np.sum(weights)
  mean = jax.tree.map(
    lambda *xs: sum(wi * np.asarray(xi, np.float64) for wi, xi in zip(w, xs, strict=True)), *sent)
  close(jax.tree.map(lambda a: a[0], alg.models(state)["global"].params), mean, tol=2e-5)
  trees_equal(jax.tree.map(jnp.shape, state.base), jax.tree.map(jnp.shape, base))  # one copy
  kernels = {a.shape for a in jax.tree.leaves(base)}
  for leaf in jax.tree.leaves(state.inner):    # adapters, never a stacked copy of the base
    assert leaf.shape[1:] not in kernels and leaf.shape not in kernels, leaf.shape


def test_bad_input_is_a_clear_error():
  model = build_model("mlp", example_shape=(5,), num_classes=3, hidden=(7,))
  base = model.init(jax.random.key(0))
  for rank in (0, -2, 1.5):
    with pytest.raises(ValueError, match=re.escape(f"rank={rank!r}")):
      L.lora(rank=rank)
  with pytest.raises(ValueError, match="alpha=0"):
    L.lora(alpha=0)
  with pytest.raises(ValueError, match="not a regular expression"):
    L.lora(targets="kernel[")
  with pytest.raises(ValueError, match=r"forward='fused'; choose one of \('factored', 'merged'\)"):
    L.lora(forward="fused")
  with pytest.raises(ValueError, match=r"LoRA target 'attn' matches no kernel.*Dense_0/kernel \(5, 7\).*"
                                       r"Dense_1/kernel \(7, 3\)"):
    L.adapted_model(model, L.lora(targets=("kernel", "attn")), base)
  with pytest.raises(ValueError, match=r"'bias' matches no kernel of the model \(it matches only "
                                       r"non-kernel parameters \['Dense_0/bias', 'Dense_1/bias'\]\)"):
    L.adapted_model(model, L.lora(targets="bias"), base)

  class Scale(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
      return x * self.param("scale", nn.initializers.ones, (3,))[None]

  flat = from_flax(Scale(), (3,), 3)
  with pytest.raises(ValueError, match=r"has no kernel .*\['scale \(3,\)'\]"):
    L.adapted_model(flat, L.lora(), flat.init(jax.random.key(0)))


# ------------------------------------------------------------------------ from a config
def _tiny_peft_config():
  """``configs/peft_lm.py`` shrunk: 2 + 2 stdlib packages (pretraining / federated), tiny LSTM,
  5 pretraining steps, 1 + 1 rounds."""
  from config_files import load_config

  c = load_config("peft_lm")
  c.rounds, c.rounds_per_call, c.eval_every, c.progress, c.plots = 1, 1, 1, False, False
  c.data.packages = ("json", "wsgiref")
  c.data.min_sentences, c.data.max_sentences = 2, 6
  c.data.seq_len, c.data.vocab_size = 8, 120
  c.model.embed, c.model.hidden = 4, 8
  c.local.batch_size = 4
  c.pretrain.packages, c.pretrain.steps, c.pretrain.batch_size = ("tomllib", "zoneinfo"), 5, 8
  for run in (c.runs.lora, c.runs.full):
    run.group_rounds, run.cohort_size = 1, 2
    run.finetune.epochs, run.finetune.learning_rates = 1, (0.1,)
  return c


def test_adapters_from_a_config_share_one_base_and_errors_name_the_run():
  """A Ditto run with ``adapters`` on the pretrained base: its state holds the base once (what
  the memory estimate counts) and per-client adapters; bad adapter fields are errors naming the
  run and the field; an algorithm outside the adapter family refuses the field."""
  import ml_collections

  from fedtree.experiment import memory, runner
  from fedtree.experiment.pretrain import pretrain_context
  from fedtree.experiment.registry import build_algorithm

  c = _tiny_peft_config()
  ctx, pre = pretrain_context(runner.make_context(c), print_fn=lambda *_: None)
  assert np.isfinite(pre["base"]["perplexity"]) and pre["base"]["group_perplexity"].shape == (2,)
  ad = dict(kind="lora", rank=2, alpha=4.0, targets=[r"w_[xh]$"])
  run = ml_collections.ConfigDict(dict(algorithm="ditto", lam=0.1, adapters=ad))
  alg = build_algorithm("d", run, ctx)
  shapes = jax.eval_shape(alg.init, jax.random.key(0))
  base_bytes = memory.tree_bytes(ctx.init_params)
  assert memory.tree_bytes(shapes.base) == base_bytes
  personal = shapes.inner.client_state.personal
  assert {p.rsplit("/", 1)[0] for p in L.param_paths(personal)} == {"lstm0/w_x", "lstm0/w_h"}
  assert jax.tree.leaves(personal)[0].shape[0] == ctx.data.num_clients
  assert memory.tree_bytes(shapes) < base_bytes + ctx.data.num_clients * base_bytes / 4
  state = alg.init(jax.random.key(0))
  trees_equal(state.base, ctx.init_params)          # the run starts from the pretrained base
  cases = ((dict(ad, kind="adapter"), r"config.runs.d.adapters.kind='adapter'; choose one of \('lora',\)"),
           (dict(ad, rank=0), r"config.runs.d.adapters: LoRA rank=0 must be"),
           (dict(ad, targets=["conv"]), r"config.runs.d.adapters: LoRA target 'conv' matches no kernel"
                                        r".*lstm0/w_x \(4, 32\)"),
           (dict(ad, forward="fused"), r"config.runs.d.adapters: LoRA forward='fused'; choose one of "
                                       r"\('factored', 'merged'\)"),
           (dict(ad, ranks=2), r"unknown field 'ranks' \(did you mean 'rank'\?\)"))
  for bad, match in cases:
    with pytest.raises(ValueError, match=match):
      build_algorithm("d", ml_collections.ConfigDict(dict(algorithm="ditto", lam=0.1, adapters=bad)), ctx)
  with pytest.raises(ValueError, match="unknown field 'adapters'"):
    build_algorithm("p", ml_collections.ConfigDict(dict(algorithm="pfedme", adapters=ad)), ctx)


@pytest.mark.slow
def test_peft_lm_config_end_to_end(tmp_path):
  """``configs/peft_lm.py`` shrunk: pretraining, then GroupPerFL with adapters and with the full
  model from the same pretrained base; every method and the base are scored per group."""
  from fedtree import experiment

  c = _tiny_peft_config()
  c.pretrain.save = str(tmp_path / "base.npz")
  results = experiment.train_and_evaluate(c, str(tmp_path / "work"))
  assert list(results) == ["pretrained", "lora", "full"]
  for run in ("lora", "full"):
    assert list(results[run]) == ["FL", "PerFL", "GroupFL", "GroupPerFL"]
    assert all(np.isfinite(s["perplexity"]) for s in results[run].values())
  assert (tmp_path / "work" / "lora_report.md").exists() and (tmp_path / "work" / "full_report.md").exists()
  from fedtree.experiment.params import load_params

  ctx = experiment.runner.make_context(c)
  saved = load_params(str(tmp_path / "base.npz"), ctx.model)     # loadable as init_params later
  assert jax.tree.structure(saved) == jax.tree.structure(ctx.model.init(jax.random.key(0)))


@pytest.mark.slow
def test_adapter_run_resumes_from_its_checkpoint_exactly(tmp_path):
  """A FedAvg run of adapters checkpoints its state (the base once, the adapters) and a run
  extended from 1 to 2 rounds resumes it to the same result as 2 rounds straight."""
  import ml_collections

  from fedtree import experiment

  def config(rounds):
    return ml_collections.ConfigDict(dict(
      seed=0, rounds=rounds, eval_every=1, rounds_per_call=1, progress=False, plots=False,
      checkpoint_every=1,
      data=dict(name="grouped_synthetic", group_sizes=(3, 2), dim=8, num_classes=3),
      topology=dict(kind="groups"), model=dict(name="mlp", hidden=(8,)),
      local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=2),
      runs=dict(fedavg=dict(algorithm="fedavg", adapters=dict(kind="lora", rank=2, alpha=2.0,
                                                             targets=("kernel",))))))

  experiment.train_and_evaluate(config(1), str(tmp_path / "a"))
  resumed = experiment.train_and_evaluate(config(2), str(tmp_path / "a"))["fedavg"]["global"]
  straight = experiment.train_and_evaluate(config(2), str(tmp_path / "b"))["fedavg"]["global"]
  assert resumed["loss"] == straight["loss"] and resumed["accuracy"] == straight["accuracy"]
  assert (tmp_path / "a" / "checkpoints" / "fedavg").is_dir()
