"""Methods on LoRA adapters (issue 50, priority 3): FFA-LoRA, FedSA-LoRA and HetLoRA each against a
plain per-client loop; the other algorithms (SCAFFOLD, FedOpt's servers, DP, compression, trees) on
adapters through a run's config."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from helpers import close

from fedtree.algorithms import fedsa_lora, ffa_lora, hetlora
from fedtree.core import loop
from fedtree.core.local import LocalSchedule
from fedtree.core.model import masked_cross_entropy
from fedtree.core.updates import UpdatePath
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model
from fedtree.toolbox import lora as L
from fedtree.toolbox import privacy
from fedtree.toolbox.traffic import model_bytes

LR, STEPS = 0.3, 2


def _problem(clients=(3, 3)):
  data, _ = grouped_synthetic(group_sizes=clients, dim=6, num_classes=3, seed=1)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(8,))
  model = model._replace(init=jax.jit(model.init))
  return data, model, model.init(jax.random.key(0))


def _schedule(data):
  return LocalSchedule(batch_size=int(data.max_train), steps=STEPS, batch_order="fixed")


def _wrapped(method, data, model, base, spec, **kw):
  return L.frozen_base(lambda m: method(model=m, data=data, local_optimizer=optax.sgd(LR),
                                        schedule=_schedule(data), **kw),
                       model=model, spec=spec, base=base)


def _local(adapted, data, c, start, trainable=lambda a: a, rebuild=lambda t, a: t):
  """Client ``c``'s ``STEPS`` full-batch SGD steps from ``start`` (adapters), on the part
  ``trainable`` selects (``rebuild(part, full)`` puts it back)."""
  n = int(data.n_train[c])
  mask = jnp.arange(data.x_train.shape[1]) < n
  x, y = data.x_train[c], data.y_train[c]

  @jax.jit
  def grad(part, full):
    return jax.grad(lambda q: masked_cross_entropy(adapted.apply(rebuild(q, full), x), y, mask))(part)

  full = start
  part = trainable(full)
  for _ in range(STEPS):
    g = grad(part, full)
    part = jax.tree.map(lambda p, gg: p - LR * gg, part, g)
  return rebuild(part, full), n


def _mean(trees, weights):
  w = np.asarray(weights, np.float64) / np.sum(weights)
  return jax.tree.map(lambda *xs: sum(wi * np.asarray(x, np.float64) for wi, x in zip(w, xs, strict=True)),
                      *trees)


def _row(tree, i=0):
  return jax.tree.map(lambda a: a[i], tree)


def ffa_lora_case(data, model, base):
  """FFA-LoRA, one round, and its per-client loop: every client trains ``B`` alone from the global ``B``
  with the seed's ``A``. Returns ``(alg, state, metrics, global adapters, the loop's B, A, B0)``."""
  spec = L.lora(rank=2, alpha=4.0)
  alg = _wrapped(ffa_lora, data, model, base, spec, seed=3)
  adapted = L.adapted_model(model, spec, base)
  a0 = L.adapter_half(adapted.init(jax.random.key(3)), "a")
  state = alg.init(jax.random.key(0))
  assert L.param_paths(state.inner.params[0]) == ["Dense_0/kernel/b", "Dense_1/kernel/b"]
  state, metrics = jax.jit(alg.round)(state, data, jax.random.key(5))
  b0 = L.adapter_half(adapted.init(jax.random.key(9)), "b")          # zeros
  sent, weights = [], []
  for c in range(data.num_clients):
    b, n = _local(adapted, data, c, L.join_halves(a0, b0), lambda a: L.adapter_half(a, "b"),
                  lambda part, full: L.join_halves(L.adapter_half(full, "a"), part))
    sent.append(L.adapter_half(b, "b"))
    weights.append(n)
  glob = _row(alg.models(state)["global"].params)
  return alg, state, metrics, glob, _mean(sent, weights), a0, b0


def fedsa_lora_case(data, model, base):
  """FedSA-LoRA, two rounds of every client, and its per-client loop: a client starts from the global
  ``A`` and its own ``B`` (the initial, zero, in round 1), trains both; the server averages ``A``; the
  client keeps its ``B``. Returns ``(alg, state, [(client's model, the loop's)])``."""
  spec = L.lora(rank=2, alpha=4.0)
  alg = _wrapped(fedsa_lora, data, model, base, spec)
  adapted = L.adapted_model(model, spec, base)
  state = alg.init(jax.random.key(0))
  glob = _row(state.inner.params[0])
  own = [L.adapter_half(glob, "b")] * data.num_clients
  step = jax.jit(alg.round)
  a = None
  for r in range(2):
    state, _ = step(state, data, jax.random.key(10 + r))
    trained, weights = [], []
    for c in range(data.num_clients):
      p, n = _local(adapted, data, c, L.join_halves(L.adapter_half(glob, "a"), own[c]))
      trained.append(p)
      weights.append(n)
    a = _mean([L.adapter_half(p, "a") for p in trained], weights)
    own = [L.adapter_half(p, "b") for p in trained]
    glob = L.join_halves(a, own[0])
  personal = alg.models(state)["personal"].params
  return alg, state, [(_row(personal, c), L.join_halves(a, own[c])) for c in range(data.num_clients)]


RANKS = (1, 2, 3, 1, 2, 3)


def hetlora_case(data, model, base):
  """HetLoRA with ranks 1, 2, 3 in turn (adapters of rank 3, ``B`` made nonzero so that truncation
  matters), one round, and its per-client loop. Returns ``(alg, state, metrics, global adapters, the
  loop's mean)``."""
  spec = L.lora(rank=3, alpha=6.0)
  alg = _wrapped(hetlora, data, model, base, spec, ranks=(1, 2, 3))
  adapted = L.adapted_model(model, spec, base)
  state = alg.init(jax.random.key(0))
  start = _row(state.inner.params[0])
  start = jax.tree.map(lambda a: a + 0.05, start)
  state = state.replace(inner=state.inner.replace(params=(jax.tree.map(lambda a: a[None], start),)))
  state, metrics = jax.jit(alg.round)(state, data, jax.random.key(5))
  sent, weights = [], []
  for c in range(data.num_clients):
    p, n = _local(adapted, data, c, L.truncate(start, RANKS[c]))
    sent.append(L.truncate(p, RANKS[c]))
    weights.append(n)
  return alg, state, metrics, _row(alg.models(state)["global"].params), _mean(sent, weights)


def test_ffa_lora_trains_b_on_the_seeds_frozen_a_like_a_per_client_loop():
  """FFA-LoRA: every client trains ``B`` alone from the global ``B`` with the seed's ``A``; the global
  ``B`` is the example-weighted mean, ``A`` is exactly the seed's draw, and a message is ``B``'s bytes."""
  data, model, base = _problem()
  _, _, metrics, glob, want, a0, b0 = ffa_lora_case(data, model, base)
  close(L.adapter_half(glob, "b"), want, tol=2e-5)
  for x, y in zip(jax.tree.leaves(L.adapter_half(glob, "a")), jax.tree.leaves(a0), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  b_bytes = model_bytes(jax.eval_shape(lambda: b0))
  assert float(metrics["uplink_bytes"]) == float(metrics["downlink_bytes"]) == b_bytes
  assert b_bytes == 4 * (2 * 8 + 2 * 3)                 # B [2, 8] and [2, 3], float32: A is never sent


def test_fedsa_lora_shares_a_and_keeps_b_like_a_per_client_loop():
  """FedSA-LoRA: each client is scored with the global ``A`` and its own ``B`` (:func:`fedsa_lora_case`)."""
  data, model, base = _problem()
  alg, state, pairs = fedsa_lora_case(data, model, base)
  assert "global" not in alg.models(state)
  for got, want in pairs:
    close(got, want, tol=5e-5)


def test_hetlora_truncates_down_and_zero_pads_up_like_a_per_client_loop():
  """HetLoRA with ranks 1, 2, 3 in turn over 6 clients (adapters of rank 3): a client trains its
  parent's adapters truncated to its rank; the server's component ``j`` is the weighted mean of the
  clients' component ``j`` with those of rank ``<= j`` counting zero; the bytes are each client's
  ``r_i`` components; every client is also scored truncated to its rank."""
  data, model, base = _problem()
  alg, state, metrics, glob, want = hetlora_case(data, model, base)
  close(glob, want, tol=2e-5)
  truncated = alg.models(state)["truncated"].params
  for c in range(data.num_clients):
    close(_row(truncated, c), L.truncate(glob, RANKS[c]), tol=0)
  # bytes: one rank component is a column of A and a row of B of every kernel, float32
  component = 4 * (6 + 8 + 8 + 3)
  assert abs(float(metrics["uplink_bytes"]) - np.mean(RANKS) * component) < 1e-3


def test_methods_on_adapters_refuse_what_cannot_work():
  data, model, base = _problem()
  common = dict(data=data, local_optimizer=optax.sgd(LR), schedule=_schedule(data))
  for method in (ffa_lora, fedsa_lora, hetlora):
    with pytest.raises(ValueError, match=rf"{method.__name__} trains LoRA adapters: give the run an adapters "
                                         r"section .*Dense_0/bias"):
      method(model=model, **common)
  spec = L.lora(rank=2)
  adapted = L.adapted_model(model, spec, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), base))
  with pytest.raises(ValueError, match=r"hetlora: ranks=\[1, 4\] must lie in 1..2, the adapters' rank"):
    hetlora(model=adapted, ranks=(1, 4), **common)
  with pytest.raises(ValueError, match=r"hetlora: ranks=\[.*\] needs 1 to 6 \(the clients\) entries"):
    hetlora(model=adapted, ranks=(1,) * 7, **common)
  with pytest.raises(ValueError, match=r"hetlora: update paths .* act on a model delta: an update path would "
                                       r"act on the zero-padded update"):
    hetlora(model=adapted, update_paths=UpdatePath(client=privacy.clip(1.0)), **common)
  with pytest.raises(ValueError, match=r"fedsa_lora: personal= is not an option"):
    fedsa_lora(model=adapted, personal=object(), **common)


# ------------------------------------------------------------------------ from a run's config
def _config(runs):
  return ml_collections.ConfigDict(dict(
    seed=0, rounds=2, eval_every=2, rounds_per_call=1, progress=False, plots=False,
    data=dict(name="grouped_synthetic", group_sizes=(3, 3), dim=8, num_classes=3),
    topology=dict(kind="groups"), model=dict(name="mlp", hidden=(8,)),
    local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=2),
    runs=runs))


ADAPTERS = dict(kind="lora", rank=2, alpha=4.0, targets=("kernel",))
RUNS = {
  "scaffold": dict(algorithm="scaffold"),
  "fedavgm": dict(algorithm="fedopt", server=dict(name="fedavgm", learning_rate=1.0, momentum=0.9)),
  "fedadam": dict(algorithm="fedopt", server=dict(name="fedadam", learning_rate=0.01)),
  "fedyogi": dict(algorithm="fedopt", server=dict(name="fedyogi", learning_rate=0.01)),
  "fedprox": dict(algorithm="fedprox", mu=0.1),
  "dp": dict(algorithm="fedavg", privacy=dict(clip_norm=1.0, noise_multiplier=0.5),
             weighting="uniform"),
  "topk": dict(algorithm="fedavg", compression=dict(uplink=dict(name="topk", k=5))),
  "tree": dict(algorithm="hierfavg"),
  "ffa_dp": dict(algorithm="ffa_lora", privacy=dict(clip_norm=1.0, noise_multiplier=0.5),
             weighting="uniform"),
  "fedsa": dict(algorithm="fedsa_lora"),
  "hetlora": dict(algorithm="hetlora", ranks=(1, 2)),
}


def test_ffa_lora_under_central_noise_from_a_config():
  """``algorithm: ffa_lora`` with a ``privacy`` section: the noise and the clipping act on ``B`` alone,
  so the frozen ``A`` is bitwise the seed's after a noisy round, while ``B`` moved."""
  from fedtree.experiment import runner
  from fedtree.experiment.registry import build_algorithm

  config = _config({"ffa_dp": dict(RUNS["ffa_dp"], adapters=ADAPTERS)})
  ctx = runner.make_context(config)
  alg = build_algorithm("ffa_dp", config.runs.ffa_dp, ctx)
  before = _row(alg.models(alg.init(jax.random.key(0)))["global"].params)
  state = loop.run(alg, ctx.data, num_rounds=1, key=jax.random.key(0))
  after = _row(alg.models(state)["global"].params)
  for x, y in zip(jax.tree.leaves(L.adapter_half(after, "a")), jax.tree.leaves(L.adapter_half(before, "a")),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert max(float(jnp.max(jnp.abs(b))) for b in jax.tree.leaves(L.adapter_half(after, "b"))) > 0


@pytest.mark.slow
def test_every_algorithm_the_issue_names_runs_on_adapters_from_a_config(tmp_path):
  _run_configs(tmp_path, list(RUNS))


def _run_configs(tmp_path, labels):
  """Each run: adapters on the config's model, trained two rounds, finite scores, the base never sent
  (a message is at most the adapters' bytes)."""
  from fedtree import experiment

  runs = {k: dict(RUNS[k], adapters=ADAPTERS) for k in labels}
  results = experiment.train_and_evaluate(_config(runs), str(tmp_path))
  adapter_bytes = 4 * 2 * (8 + 8 + 8 + 3)
  for label in labels:
    for name, s in results[label].items():
      assert np.isfinite(s["loss"]), (label, name)
      up = s.get("uplink_MB")
      if up is not None:
        assert up * 1e6 <= 2 * 2 * 6 * adapter_bytes * 2 + 1e-9, (label, up)   # SCAFFOLD: two models a way
