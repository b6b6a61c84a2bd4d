"""Compressed updates (fedtree.toolbox.compression): unbiased quantizers within their variance bounds,
exact top-k, error feedback against a per-client loop, lossless casts, hand-counted sizes, and
the config section on every edge of a tree (an identity compressor is bitwise the plain run)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import small_context as _ctx
from helpers import trees_equal
from helpers import with_update_paths as _with_path

from fedtree.algorithms import hierfavg
from fedtree.core.updates import UpdatePath, UpdateState, transform_children
from fedtree.experiment import registry
from fedtree.experiment.capabilities import compression as sections
from fedtree.toolbox import compression as cp

TREE = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)), jnp.float32),
        "b": jnp.asarray([0.5, -2.0, 1.25, 3.0], jnp.float32)}


def _draws(c, x, n):
  keys = jax.random.split(jax.random.key(7), n)
  return jax.jit(jax.vmap(c.apply, in_axes=(None, 0)))(x, keys)


@pytest.mark.parametrize("name,bits", [("qsgd", 1), ("qsgd", 3), ("rotated", 1), ("rotated", 2)])
def test_quantizers_are_unbiased_within_their_variance_bound(name, bits):
  """The mean of n seeded draws is within 5 standard errors of x (per coordinate, from the
  variance bound); the mean squared error stays under the bound (qsgd: Δ²/4 per coordinate,
  Δ = range / (2^b - 1); rotated: m ||x||² / (2^b - 1)², the rotated range being at most 2||x||)."""
  n = 4000
  x = TREE["w"].reshape(-1)
  out = np.asarray(_draws(sections.compressor(name, bits=bits), x, n), np.float64)
  xs = np.asarray(x, np.float64)
  if name == "qsgd":
    delta = (xs.max() - xs.min()) / (2 ** bits - 1)
    bound = xs.size * delta ** 2 / 4
    per_coord = delta ** 2 / 4
  else:
    bound = 16 * np.sum(xs ** 2) / (2 ** bits - 1) ** 2
    per_coord = bound          # a coordinate's variance is at most the total
  np.testing.assert_array_less(np.abs(out.mean(0) - xs), 5 * np.sqrt(per_coord / n) + 1e-6)
  mse = np.mean(np.sum((out - xs) ** 2, axis=1))
  assert mse <= bound * (1 + 5 / np.sqrt(n)), (mse, bound)
  assert mse > 0


def test_drive_keeps_the_projection_on_x():
  """DRIVE's scale ||x||²/||Rx||₁ makes <x̂, x> = ||x||² for every rotation; one bit per coordinate."""
  x = TREE["w"]
  for s in range(3):
    y = jax.jit(cp.drive().apply)(x, jax.random.key(s))
    np.testing.assert_allclose(float(jnp.vdot(y, x)), float(jnp.vdot(x, x)), rtol=1e-4)


def test_topk_keeps_exactly_the_k_largest_magnitudes():
  flat = np.concatenate([np.asarray(TREE["b"]), np.asarray(TREE["w"]).reshape(-1)])  # ravel order
  for k in (1, 5, 16):
    out = jax.jit(cp.topk(k=k).apply)(TREE, jax.random.key(0))
    got = np.concatenate([np.asarray(out["b"]), np.asarray(out["w"]).reshape(-1)])
    keep = np.argsort(-np.abs(flat))[:k]
    want = np.zeros_like(flat)
    want[keep] = flat[keep]
    np.testing.assert_array_equal(got, want)
  out = jax.jit(cp.randk(fraction=0.25).apply)(TREE, jax.random.key(0))
  got = np.concatenate([np.asarray(out["b"]), np.asarray(out["w"]).reshape(-1)])
  assert np.sum(got != 0) == 4 and np.all((got == 0) | (got == flat))


@pytest.mark.parametrize("name,kw", [("topk", {"k": 3}), ("scaled_sign", {})])
def test_error_feedback_against_a_per_client_loop(name, kw):
  """Four children over four rounds, some not reporting: each sends C(Δ + e) and keeps
  e' = Δ + e - C(Δ + e); a child that does not report keeps its residual."""
  c = sections.compressor(name, **kw)
  t = cp.uplink(c, error_feedback=True)
  num = 4
  state = UpdateState(client=t.init(TREE, num))
  parent = jnp.asarray([0, 0, 1, 1], jnp.int32)
  path = UpdatePath(client=t)
  rng = np.random.default_rng(1)
  ref_e = [jax.tree.map(np.zeros_like, TREE) for _ in range(num)]
  step = jax.jit(lambda state, deltas, mask, key: transform_children(
    path, state, deltas, parent, jnp.ones(num), mask, 2, key))
  apply = jax.jit(c.apply)
  for r in range(4):
    deltas = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=(num,) + a.shape), jnp.float32), TREE)
    mask = jnp.asarray([True, r % 2 == 0, True, r != 1])
    sent, state, sums = step(state, deltas, mask, jax.random.key(r))
    for i in range(num):
      v = jax.tree.map(lambda d, e, i=i: np.asarray(d[i]) + e, deltas, ref_e[i])
      out = apply(jax.tree.map(jnp.asarray, v), jax.random.key(0))
      trees_equal(jax.tree.map(np.asarray, out), jax.tree.map(lambda s, i=i: np.asarray(s[i]), sent))
      if mask[i]:
        ref_e[i] = jax.tree.map(lambda a, b: a - np.asarray(b), v, out)
      for lf in ("w", "b"):
        np.testing.assert_allclose(np.asarray(state.client.residual[lf][i]), ref_e[i][lf],
                                   rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sums["uplink_bytes"]),
                               float(c.bits(TREE)) / 8 * np.asarray([1 + (r % 2 == 0), 1 + (r != 1)]))


def test_casts_are_lossless_where_exact():
  x = {"a": jnp.asarray([0.0, 1.0, -2.5, 1024.0, 0.125, -30720.0], jnp.float32)}
  for name in ("fp16", "bf16"):
    trees_equal(sections.compressor(name).apply(x, jax.random.key(0)), x)
  y = cp.fp16().apply({"a": jnp.asarray([1 + 2.0 ** -12], jnp.float32)}, jax.random.key(0))
  assert float(y["a"][0]) == 1.0     # and lossy where not representable


def test_sizes_against_hand_counts():
  """w [3, 4] and b [4] in float32: 16 coordinates."""
  want = {("none", ()): 16 * 32, ("fp16", ()): 16 * 16, ("bf16", ()): 256,
          ("qsgd", (("bits", 2),)): (2 * 12 + 64) + (2 * 4 + 64),
          ("rotated", (("bits", 2),)): (2 * 16 + 64) + (2 * 4 + 64),     # 12 padded to 16
          ("drive", ()): (16 + 32) + (4 + 32),
          ("topk", (("k", 3),)): 3 * (32 + 4),                             # value + log2(16) index bits
          ("randk", (("fraction", 0.2),)): 3 * 32,                          # floor(0.2 * 16) = 3
          ("sign", ()): 16, ("scaled_sign", ()): 16 + 32}
  assert {n for n, _ in want} == set(sections.COMPRESSORS)
  for (name, kw), bits in want.items():
    assert float(sections.compressor(name, **dict(kw)).bits(TREE)) == bits, name


def test_bits_may_be_swept_but_k_may_not():
  f = jax.jit(lambda b: cp.qsgd(bits=b).bits(TREE))
  assert float(f(3.0)) == 3 * 16 + 128
  with pytest.raises(ValueError, match="cannot be a sweep axis"):
    jax.jit(lambda k: cp.topk(k=k).bits(TREE))(3)


@pytest.mark.parametrize("kwargs,match", [
  (dict(name="qsgd", bits=0), "bits=0 must be an integer >= 1"),
  (dict(name="qsgd"), "needs bits"),
  (dict(name="rotated", bits=None), "needs bits"),
  (dict(name="qsgd", bits=1.5), "bits=1.5 must be"),
  (dict(name="topk", k=0), "k=0 must be an integer >= 1"),
  (dict(name="topk"), "exactly one of k"),
  (dict(name="randk", fraction=1.5), r"fraction=1.5 must be in \(0, 1\]"),
  (dict(name="sign", bits=2), "takes no bits"),
  (dict(name="zip"), "name='zip' is unknown; choose one of"),
])
def test_bad_input_is_a_clear_error(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sections.compressor(**kwargs)


def test_k_larger_than_the_update_and_bad_edges_are_refused():
  with pytest.raises(ValueError, match="k=17 exceeds the update's size"):
    cp.topk(k=17).bits(TREE)
  with pytest.raises(ValueError, match="cannot compress a model sent down"):
    cp.downlink(cp.topk(k=1))
  with pytest.raises(ValueError, match="vote is signSGD's majority vote"):
    sections.compression_parts({"uplink": {"name": "qsgd", "bits": 2, "vote": 0.1}}, None)
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['bitz'\]"):
    sections.compression_parts({"uplink": {"name": "qsgd", "bitz": 2}}, None)
  with pytest.raises(ValueError, match="choose from"):
    sections.compression_parts({"up": {"name": "qsgd", "bits": 2}}, None)


def test_majority_vote_is_the_sign_of_the_weighted_sign_sum():
  signs = jnp.asarray([[1.0, -1.0, 1.0], [1.0, 1.0, -1.0], [-1.0, -1.0, -1.0]])
  w = jnp.asarray([1.0, 1.0, 3.0])
  node = cp.majority_vote(step=0.5)
  dsum = {"a": jnp.sum(signs * w[:, None], 0)[None]}
  out, wsum, _, _ = node.apply(dsum, jnp.asarray([5.0]), {}, (), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out["a"]) / 5.0, [[-0.5, -0.5, -0.5]])


# ------------------------------------------------------------------------ in algorithms
def _run(alg, ctx, rounds=2):
  state = alg.init(jax.random.key(0))
  step = jax.jit(alg.round)
  out = []
  for r in range(rounds):
    state, m = step(state, ctx.data, jax.random.fold_in(jax.random.key(3), r))
    out.append(m)
  return state, out


def test_identity_compressor_is_bitwise_the_plain_run_and_counts_the_model():
  ctx = _ctx()
  run = ml_collections.ConfigDict({"algorithm": "fedavg", "chunk_size": 3,
                                   "compression": {"uplink": {"name": "none"}, "downlink": {"name": "none"}}})
  kw = registry.factory_kwargs("f", run, ctx)
  plain = _with_path(ctx, "fedavg", None)
  built = registry.SPECS["fedavg"].factory(**kw)
  sa, ma = _run(plain, ctx)
  sb, mb = _run(built, ctx)
  trees_equal(sa.params, sb.params)
  size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(ctx.model.init(jax.random.key(0))))
  for a, b in zip(ma, mb, strict=True):
    for k, v in a.items():
      np.testing.assert_array_equal(np.asarray(v), np.asarray(b[k]), err_msg=k)
    assert float(b["uplink_bytes"]) == size and float(b["downlink_bytes"]) == size


def test_three_level_tree_compresses_only_at_the_clients():
  """hierfavg on 2 levels of servers: 8-bit qsgd from the clients to the edges (and fp16 down to
  them), nothing between the edges and the root."""
  ctx = _ctx()
  run = ml_collections.ConfigDict({
    "algorithm": "hierfavg", "periods": (2,), "chunk_size": 3,
    "compression": {"levels": {"-1": {"uplink": {"name": "qsgd", "bits": 8}, "downlink": {"name": "fp16"}}}}})
  kw = registry.factory_kwargs("h", run, ctx)
  alg = hierfavg(**kw)
  params = ctx.model.init(jax.random.key(0))
  leaves = jax.tree.leaves(params)
  state, ms = _run(alg, ctx)
  assert float(ms[0]["uplink_bytes"]) == sum(8 * x.size + 64 for x in leaves) / 8
  assert float(ms[0]["downlink_bytes"]) == sum(2 * x.size for x in leaves)
  counts = ("level0_children_sent", "level0_uplink_messages", "level0_downlink_messages")   # no statistic
  assert not any(k.startswith("level0_") and k not in counts for m in ms for k in m)
  assert all(np.isfinite(float(v)) for m in ms for v in m.values())


def test_every_run_reports_its_bytes_per_round_and_cumulative(tmp_path):
  """FedAvg on logreg (8 features, 3 classes: 27 float32 = 108 bytes), 5 clients a round, 3 rounds
  in calls of 2 and 1: 8-bit qsgd uplinks (8·24 + 64 + 8·3 + 64) bits = 43 bytes per client, the
  model comes down uncompressed (108 bytes). metrics.jsonl and summary.json carry them."""
  import json

  from fedtree.experiment.runner import train_and_evaluate

  config = ml_collections.ConfigDict(dict(
    seed=0, rounds=3, eval_every=3, rounds_per_call=2, progress=False, plots=False,
    data=dict(name="grouped_synthetic", group_sizes=(3, 2), dim=8, num_classes=3),
    topology=dict(kind="groups"), model=dict(name="logreg"),
    local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=1),
    runs=dict(q8=dict(algorithm="fedavg", compression=dict(uplink=dict(name="qsgd", bits=8))))))
  train_and_evaluate(config, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  up = {"q8": 43.0}
  for row in rows:
    assert row["clients_trained"] == 5
    assert row["uplink_bytes"] == up[row["run"]] and row["downlink_bytes"] == 108.0
    assert row["round_uplink_MB"] == up[row["run"]] * 5 / 1e6
    assert row["uplink_MB"] == up[row["run"]] * 5 * row["round"] / 1e6
    assert row["downlink_MB"] == 108.0 * 5 * row["round"] / 1e6
  assert [(r["run"], r["round"]) for r in rows] == [("q8", 2), ("q8", 3)]
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["q8"]["global"]["uplink_MB"] == 43 * 15 / 1e6
  assert summary["q8"]["global"]["downlink_MB"] == 108 * 15 / 1e6


def test_accuracy_against_uplink_megabytes_is_plotted(tmp_path):
  pytest.importorskip("matplotlib")
  import json

  from fedtree.experiment import plots

  rows = [{"run": run, "round": r, "uplink_MB": mb * r, "global/accuracy": 0.5 + r / 100}
          for run, mb in (("none", 1.0), ("qsgd8", 0.25)) for r in (1, 2, 3)]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  written = plots.write_run_plots(str(tmp_path))
  assert str(tmp_path / "plot_accuracy_uplink.png") in written
  with open(tmp_path / "plot_accuracy_uplink.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_sign_votes_at_the_edges_and_fp16_between_the_edges_and_the_root():
  """A 3-level HierFAVG (root every 2 rounds): clients send signs and their edge servers take
  the majority vote (step 0.01: every edge coordinate moves by exactly 0 or ±0.01 in a round
  where the root does not aggregate); the edges send fp16 updates to the root (2 bytes a
  coordinate, counted as level0_uplink_bytes in the root's rounds only)."""
  ctx = _ctx()
  run = ml_collections.ConfigDict({
    "algorithm": "hierfavg", "periods": (2,), "chunk_size": 3,
    "compression": {"levels": {"-1": {"uplink": {"name": "sign", "vote": 0.01}},
                               "0": {"uplink": {"name": "fp16"}}}}})
  alg = hierfavg(**registry.factory_kwargs("h", run, ctx))
  s0 = alg.init(jax.random.key(0))
  s1, ms = _run(alg, ctx, rounds=1)
  moved = np.concatenate([np.abs(np.asarray(a) - np.asarray(b)).ravel()
                          for a, b in zip(jax.tree.leaves(s1.params[1]), jax.tree.leaves(s0.params[1]),
                                          strict=True)])
  np.testing.assert_allclose(moved[moved > 1e-6], 0.01, rtol=1e-3)
  assert np.sum(moved > 1e-6) > moved.size // 2
  d = sum(x.size for x in jax.tree.leaves(ctx.model.init(jax.random.key(0))))
  assert float(ms[0]["uplink_bytes"]) == d / 8 and float(ms[0]["level0_uplink_bytes"]) == 0
  s2, m2 = jax.jit(alg.round)(s1, ctx.data, jax.random.key(9))
  assert float(m2["level0_uplink_bytes"]) == 2 * d


def test_shipped_config_builds_both_variants():
  from config_files import load_config

  for variant in (None, "tree"):
    c = load_config("compression", *(() if variant is None else (variant,)))
    assert set(c.runs) == set(c.run_order) and len(c.runs) == 7
  with pytest.raises(ValueError, match="choose no variant or 'tree'"):
    load_config("compression", "deep")


@pytest.mark.slow
def test_shipped_config_runs_shrunk(tmp_path):
  """configs/compression.py:tree, every run for 2 rounds on 10 clients."""
  import json

  from config_files import load_config

  from fedtree.experiment.runner import train_and_evaluate

  c = load_config("compression", "tree")
  c.rounds, c.eval_every, c.rounds_per_call, c.progress, c.plots = 2, 2, 2, False, False
  c.data.group_sizes, c.data.mean_examples, c.data.max_examples = (3, 3, 2, 2), 12.0, 24
  for run in c.runs.values():
    run.cohort_size = 2
  results = train_and_evaluate(c, str(tmp_path))
  summary = json.load(open(tmp_path / "summary.json"))
  ups = {label: summary[label]["global"]["uplink_MB"] for label in results}
  assert ups["none"] > ups["qsgd8"] > ups["qsgd2"] > ups["rotated1"] > ups["top1"] == ups["top1_ef"] > 0


@pytest.mark.slow
def test_bits_sweep_as_an_axis_and_k_is_refused_with_the_reason():
  from fedtree.experiment import runner

  def tiny(run):
    c = ml_collections.ConfigDict(dict(
      seed=0, rounds=2, eval_every=2, rounds_per_call=2, progress=False, plots=False,
      data=dict(name="grouped_synthetic", group_sizes=(3, 2), dim=8, num_classes=3),
      topology=dict(kind="groups"), model=dict(name="logreg"),
      local=dict(optimizer="sgd", learning_rate=0.1, batch_size=8, steps=1), runs=dict(r=run)))
    from fedtree.experiment.sweep import default_sweep
    c.sweep = default_sweep()
    return c

  c = tiny(dict(algorithm="fedavg", compression=dict(uplink=dict(name="qsgd", bits=2))))
  c.sweep.params = "runs.r.compression.uplink.bits=1,4"
  res = runner.train_and_evaluate(c, None)
  rows = res["r"]["sweep"]["settings"]
  assert [s["name"] for s in rows] == ["bits=1", "bits=4"]
  # every setting reports its own bytes: those of the same run alone
  for row, bits in zip(rows, (1, 4), strict=True):
    alone = runner.train_and_evaluate(
      tiny(dict(algorithm="fedavg", compression=dict(uplink=dict(name="qsgd", bits=bits)))), None)
    for k in ("uplink_MB", "downlink_MB"):
      assert row["mean"][k] == alone["r"]["global"][k], (bits, k)
  assert rows[0]["mean"]["uplink_MB"] < rows[1]["mean"]["uplink_MB"]
  assert rows[0]["mean"]["downlink_MB"] == rows[1]["mean"]["downlink_MB"] == 108 * 5 * 2 / 1e6
  c = tiny(dict(algorithm="fedavg", compression=dict(uplink=dict(name="topk", k=3))))
  c.sweep.params = "runs.r.compression.uplink.k=2,3"
  # the field's annotation from the capability's declared fields (issue 35), as for an algorithm's
  with pytest.raises(ValueError, match=r"'k' \(annotated int \| None\) changes array shapes"):
    runner.train_and_evaluate(c, None)
  c = tiny(dict(algorithm="fedavg", compression=dict(uplink=dict(name="topk", k=3.0))))
  c.sweep.params = "runs.r.compression.uplink.k=2.0,3.0"   # as floats: k is an int field all the same
  with pytest.raises(ValueError, match=r"'k' \(annotated int \| None\) changes array shapes.*instead$"):
    runner.train_and_evaluate(c, None)
