"""Robust aggregators (fedtree.toolbox.robust) against plain numpy references, parent by parent, on
random updates with ties, empty slots, a parent below Krum's bound and an empty parent."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedtree.core.updates import Block
from fedtree.experiment.capabilities import robust as sections
from fedtree.toolbox import robust

SHAPES = {"a": (2, 3), "b": (4,)}
D = 10


def _block(seed=0, k=9, counts=(9, 7, 4, 0), ties=False):
  """A block of ``len(counts)`` parents with ``k`` slots, parent ``p`` holding ``counts[p]`` valid
  updates in scattered slots; ``ties``: small integers, so many values and updates repeat."""
  rng = np.random.default_rng(seed)
  p = len(counts)
  if ties:
    flat = rng.integers(-2, 3, size=(p, k, D)).astype(np.float32)
    flat[:, 1] = flat[:, 0]   # two identical updates in every parent
  else:
    flat = rng.normal(size=(p, k, D)).astype(np.float32)
    flat[:, 0] *= 20.0        # an outlier
  valid = np.zeros((p, k), bool)
  for i, c in enumerate(counts):
    valid[i, rng.permutation(k)[:c]] = True
  if ties:
    for i, c in enumerate(counts):
      if c >= 2:
        valid[i, :2] = True
        extra = np.flatnonzero(valid[i])[c:] if valid[i].sum() > c else []
        valid[i, extra] = False
  flat = np.where(valid[..., None], flat, 0.0).astype(np.float32)
  weights = np.where(valid, rng.uniform(0.5, 2.0, size=(p, k)), 0.0).astype(np.float32)
  deltas = {"a": jnp.asarray(flat[..., :6].reshape(p, k, 2, 3)), "b": jnp.asarray(flat[..., 6:])}
  clients = np.where(valid, np.arange(p * k).reshape(p, k), -1).astype(np.int32)
  return Block(deltas, jnp.asarray(weights), jnp.asarray(valid), jnp.asarray(clients)), flat, valid, weights


def _flat(tree):
  a = np.asarray(tree["a"])
  return np.concatenate([a.reshape(a.shape[0], -1), np.asarray(tree["b"])], axis=1)


def _run(agg, block):
  s, w, stats = jax.jit(agg.aggregate)(block, {}, jax.random.key(0))
  s, w = _flat(s), np.asarray(w)
  est = np.where(w[:, None] > 0, s / np.where(w > 0, w, 1)[:, None], 0.0)
  return est, w, {k: np.asarray(v) for k, v in stats.items()}


# ------------------------------------------------------------------------ numpy references
def ref_trimmed(x, beta):
  n = len(x)
  k = int(np.floor(np.float32(beta) * np.float32(n)))
  return np.sort(x, axis=0)[k:n - k].mean(axis=0)


def _dists(x):
  return ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)


def _krum_scores(d, cand, f):
  """Krum's scores among the candidates ``cand``: each one's squared distances to its
  ``max(1, r - f - 2)`` nearest other candidates (at most ``r - 1``), ``r`` their number (the
  paper's ``n - f - 2``; at least one neighbour, as Flower's ``aggregate_krum``)."""
  idx = np.flatnonzero(cand)
  r = len(idx)
  nb = min(max(r - f - 2, 1), max(r - 1, 0))
  scores = np.full(len(cand), np.inf)
  for i in idx:
    others = np.sort([d[i, j] for j in idx if j != i])
    scores[i] = np.sum(others[:nb])
  return scores


def ref_krum_sel(x, f, m):
  n = len(x)
  scores = _krum_scores(_dists(x), np.ones(n, bool), f)
  m_eff = int(np.clip(n - f if m is None else m, 1, n))
  return np.argsort(scores, kind="stable")[:m_eff]


def ref_krum(x, f, m):
  return x[ref_krum_sel(x, f, m)].mean(axis=0)


def ref_krum_weighted(x, w, f, m):
  """Flower's multi-Krum: the kept updates averaged with their weights (example counts)."""
  keep = ref_krum_sel(x, f, m)
  return (w[keep, None] * x[keep]).sum(0) / w[keep].sum()


def ref_bulyan_sel(x, f):
  """Bulyan's θ = n - 2f choices: Krum over the candidates left, one at a time."""
  n = len(x)
  d = _dists(x)
  theta = int(np.clip(n - 2 * f, 1, n))
  chosen = np.zeros(n, bool)
  for _ in range(theta):
    chosen[np.argmin(_krum_scores(d, ~chosen, f))] = True
  return chosen


def ref_bulyan(x, f):
  n = len(x)
  theta = int(np.clip(n - 2 * f, 1, n))
  sel = x[ref_bulyan_sel(x, f)]
  keep = int(np.clip(theta - 2 * f, 1, theta))
  med = np.median(sel, axis=0)
  order = np.argsort(np.abs(sel - med), axis=0, kind="stable")
  return np.take_along_axis(sel, order, axis=0)[:keep].mean(axis=0)


def ref_geomed(x, w, iterations, nu):
  x = x.astype(np.float64)
  z = (w[:, None] * x).sum(0) / w.sum()
  for _ in range(iterations):
    b = w / np.maximum(nu, np.linalg.norm(x - z, axis=1))
    z = (b[:, None] * x).sum(0) / b.sum()
  return z


def ref_norm_bound(x, w, tau):
  s = np.minimum(1.0, tau / np.linalg.norm(x, axis=1))
  return (w[:, None] * s[:, None] * x).sum(0) / w.sum()


def ref_cclip(x, tau, iterations, center):
  v = {"zero": np.zeros(x.shape[1]), "mean": x.mean(0), "median": np.median(x, axis=0)}[center]
  for _ in range(iterations):
    diff = x - v
    s = np.minimum(1.0, tau / np.linalg.norm(diff, axis=1))
    v = v + (s[:, None] * diff).mean(0)
  return v


def ref_fltrust(x, root):
  """Per parent: ``x`` its valid updates, ``root`` which of them are trusted."""
  g0 = x[root].mean(0)
  others = x[~root].astype(np.float64)
  cos = others @ g0 / (np.linalg.norm(others, axis=1) * np.linalg.norm(g0))
  s = np.maximum(cos, 0.0)
  if s.sum() == 0:
    return np.zeros_like(g0)
  scaled = others * (np.linalg.norm(g0) / np.linalg.norm(others, axis=1))[:, None]
  return (s[:, None] * scaled).sum(0) / s.sum()


CASES = [
  ("median", robust.median(), lambda x, w: np.median(x, axis=0)),
  ("trimmed_mean", robust.trimmed_mean(beta=0.2), lambda x, w: ref_trimmed(x, 0.2)),
  ("trimmed_mean_0", robust.trimmed_mean(beta=0.0), lambda x, w: x.mean(0)),
  ("krum", robust.krum(f=1, m=1), lambda x, w: ref_krum(x, 1, 1)),
  ("multi_krum", robust.krum(f=2), lambda x, w: ref_krum(x, 2, None)),
  ("multi_krum_m3", robust.krum(f=1, m=3), lambda x, w: ref_krum(x, 1, 3)),
  ("multi_krum_weighted", robust.krum(f=1, m=3, weighted=True), lambda x, w: ref_krum_weighted(x, w, 1, 3)),
  ("multi_krum_weighted_default_m", robust.krum(f=2, weighted=True),
   lambda x, w: ref_krum_weighted(x, w, 2, None)),
  ("bulyan", robust.bulyan(f=1), lambda x, w: ref_bulyan(x, 1)),
  ("geometric_median", robust.geometric_median(iterations=5), lambda x, w: ref_geomed(x, w, 5, 1e-6)),
  ("norm_bound", robust.norm_bound(tau=2.0), lambda x, w: ref_norm_bound(x, w, 2.0)),
  ("cclip_zero", robust.centered_clip(tau=1.0, iterations=2), lambda x, w: ref_cclip(x, 1.0, 2, "zero")),
  ("cclip_median", robust.centered_clip(tau=1.0, iterations=3, center="median"),
   lambda x, w: ref_cclip(x, 1.0, 3, "median")),
  ("cclip_mean", robust.centered_clip(tau=0.5, center="mean"), lambda x, w: ref_cclip(x, 0.5, 1, "mean")),
  ("block_mean", robust.mean(), lambda x, w: (w[:, None] * x).sum(0) / w.sum()),
]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("name,agg,ref", CASES, ids=[c[0] for c in CASES])
def test_aggregator_matches_numpy_per_parent(name, agg, ref, ties):
  """Parents with 9, 7 and 4 valid updates (4 < 2f + 3 for f = 1, 2: handled as documented) and
  an empty parent (weight 0, nothing moves); slots scattered."""
  block, flat, valid, weights = _block(seed=3, ties=ties)
  est, w, _ = _run(agg, block)
  for p in range(flat.shape[0]):
    if not valid[p].any():
      assert w[p] == 0 and np.all(est[p] == 0)
      continue
    want = ref(flat[p][valid[p]], weights[p][valid[p]].astype(np.float64))
    np.testing.assert_allclose(est[p], want, rtol=2e-5, atol=2e-5, err_msg=f"{name} parent {p}")
    np.testing.assert_allclose(w[p], weights[p].sum(), rtol=1e-6)


@pytest.mark.parametrize("ties", [False, True])
def test_fltrust_matches_numpy_per_parent(ties):
  """Trusted slots in parents 0 and 1, none in parent 2 (left unchanged, weight 0), an empty
  parent; with ``ties`` some updates are opposite to the reference (trust 0)."""
  block, flat, valid, weights = _block(seed=4, ties=ties)
  clients = np.asarray(block.clients)
  trusted = [int(clients[p][valid[p]][j]) for p, j in ((0, 0), (0, 3), (1, 2))]
  est, w, st = _run(robust.fltrust(trusted=trusted), block)
  for p in range(flat.shape[0]):
    root = np.isin(clients[p], trusted) & valid[p]
    if not root.any():
      assert w[p] == 0 and np.all(est[p] == 0)
      continue
    x = flat[p][valid[p]]
    want = ref_fltrust(x, root[valid[p]])
    np.testing.assert_allclose(est[p], want, rtol=2e-5, atol=2e-5, err_msg=f"parent {p}")
    np.testing.assert_allclose(w[p], weights[p][valid[p] & ~root].sum(), rtol=1e-6)
  root0 = np.isin(clients[0], trusted) & valid[0]
  assert st["fltrust_zeroed"][0] == np.sum(flat[0][valid[0] & ~root0] @ flat[0][root0].mean(0) <= 0)


def _attacked_cohort(seed, n=7, d=D, shift=50.0):
  """One parent of ``n`` honest-looking updates (standard normal) whose slot ``seed % n`` an
  attacker holds, shifted by ``+shift`` in every coordinate."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  bad = seed % n
  x[bad] += shift
  return x, bad


def _parents_block(xs, ws=None, valid=None):
  """One parent per problem: ``xs [P, n, D]`` (every slot valid unless ``valid``), weights ``ws``."""
  xs = np.asarray(xs, np.float32)
  p, n = xs.shape[:2]
  ws = np.ones((p, n), np.float32) if ws is None else np.asarray(ws, np.float32)
  valid = np.ones((p, n), bool) if valid is None else valid
  deltas = {"a": jnp.asarray(xs[..., :6].reshape(p, n, 2, 3)), "b": jnp.asarray(xs[..., 6:])}
  clients = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (p, n))
  return Block(deltas, jnp.asarray(ws), jnp.asarray(valid), clients)


def test_bulyan_with_f1_never_keeps_a_far_attacker():
  """Issue 40: on 7 clients with f = 1 Bulyan picks θ = 5 by Krum one at a time; the last pick,
  among 3 candidates, scores each against max(1, 3 - 1 - 2) = 1 neighbour. Scored against 0
  neighbours (every score 0) the pick was the lowest remaining slot, the attacker included: on 20
  seeded problems with one +50 attacker it was kept in 10. Now never, and the selection and the
  estimate equal the per-client reference (the 20 problems are the parents of one block)."""
  problems = [_attacked_cohort(seed) for seed in range(20)]
  block = _parents_block([x for x, _ in problems])
  sel = np.asarray(jax.jit(lambda b: robust.bulyan_selection(b, f=1))(block))
  est, _, st = _run(robust.bulyan(f=1), block)
  for seed, (x, bad) in enumerate(problems):
    np.testing.assert_array_equal(sel[seed], ref_bulyan_sel(x, 1), err_msg=f"seed {seed}")
    assert not sel[seed, bad], seed
    np.testing.assert_allclose(est[seed], ref_bulyan(x, 1), rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(st["bulyan_selected"], 5)


@pytest.mark.parametrize("n,f", [(4, 0), (7, 1), (11, 2)])
def test_krum_and_bulyan_on_small_cohorts_match_the_reference(n, f):
  """Small cohorts, where the neighbour count reaches its floor of 1: Bulyan at its last selections,
  and Krum on parents whose reported updates fall below its bound (empty slots; 2 to n valid; Krum's
  estimate is the update it picks)."""
  problems = [_attacked_cohort(seed, n=n, shift=5.0)[0] for seed in range(6)]
  est, _, _ = _run(robust.bulyan(f=f), _parents_block(problems))
  for i, x in enumerate(problems):
    np.testing.assert_allclose(est[i], ref_bulyan(x, f), rtol=2e-5, atol=2e-5, err_msg=f"n={n} f={f} {i}")
  krum = robust.krum(f=f, m=1)   # (one compile for both blocks: same function, same shapes)
  kr, _, _ = _run(krum, _parents_block(problems))
  reported = [2 + i % (n - 1) for i in range(6)]
  valid = np.arange(n)[None, :] < np.asarray(reported)[:, None]
  short, _, _ = _run(krum, _parents_block(problems, valid=valid))
  for i, (x, r) in enumerate(zip(problems, reported, strict=True)):
    np.testing.assert_allclose(kr[i], ref_krum(x, f, 1), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(short[i], ref_krum(x[:r], f, 1), rtol=2e-5, atol=2e-5, err_msg=f"{n} {f} {r}")


def _flower_results(x, w):
  """Flower's ``results``: one ``(layers, num_examples)`` per client, the layers as fedtree's."""
  return [([x[i, :6].reshape(2, 3).astype(np.float64), x[i, 6:].astype(np.float64)], int(w[i]))
          for i in range(len(x))]


def test_bulyan_and_multi_krum_equal_flowers_own():
  """Flower's own ``aggregate_bulyan`` / ``aggregate_krum`` (``flwr``, the ``flower`` extra: skipped
  without it) on the same updates: Bulyan with f = 1 and 2, multi-Krum weighted by example counts."""
  agg = pytest.importorskip("flwr.server.strategy.aggregate")
  for n, f in [(7, 1), (8, 1), (11, 2)]:
    xs = [_attacked_cohort(seed, n=n)[0] for seed in range(10)]
    ws = [np.random.default_rng(seed).integers(5, 50, size=n) for seed in range(10)]
    block = _parents_block(xs, ws)
    bulyan, _, _ = _run(robust.bulyan(f=f), block)
    kept = {m: _run(robust.krum(f=f, m=m, weighted=True), block)[0] for m in (2, n - f)}
    for i, (x, w) in enumerate(zip(xs, ws, strict=True)):
      want = agg.aggregate_bulyan(_flower_results(x, w), num_malicious=f, aggregation_rule=agg.aggregate_krum,
                                  to_keep=0)
      np.testing.assert_allclose(bulyan[i], np.concatenate([want[0].ravel(), want[1]]), rtol=2e-5, atol=2e-5)
      for m, est in kept.items():
        want = agg.aggregate_krum(_flower_results(x, w), num_malicious=f, to_keep=m)
        np.testing.assert_allclose(est[i], np.concatenate([want[0].ravel(), want[1]]), rtol=2e-5, atol=2e-5)


def test_selecting_aggregators_count_the_attackers_they_kept():
  """``watch`` (the attackers' slots) -> ``kept_attackers`` = |kept ∩ watched| per parent,
  against the numpy Krum selection; aggregators that do not choose do not watch."""
  from fedtree.toolbox import attacks

  block, flat, valid, _ = _block(seed=5)
  clients = np.asarray(block.clients)
  bad_ids = clients[valid][::2]
  a = attacks.attackers(int(clients.max()) + 1, ids=bad_ids)
  _, _, st = _run(attacks.watch_kept(robust.krum(f=1, m=3), a), block)
  for p in range(3):
    slots = np.flatnonzero(valid[p])
    kept = slots[ref_krum_sel(flat[p][slots], 1, 3)]
    assert st["kept_attackers"][p] == np.isin(clients[p, kept], bad_ids).sum()
  assert st["kept_attackers"][3] == 0
  _, _, st = _run(attacks.watch_kept(robust.bulyan(f=1), a), block)
  sel = np.asarray(robust.bulyan_selection(block, f=1))
  np.testing.assert_array_equal(st["kept_attackers"], (sel & np.isin(clients, bad_ids)).sum(1))
  assert robust.watches(robust.fltrust(trusted=[0])) and not robust.watches(robust.median())
  med = robust.median()
  assert attacks.watch_kept(med, a) is med
  redraw = attacks.attackers(10, fraction=0.5, redraw=True)
  agg = robust.krum(f=1)
  assert attacks.watch_kept(agg, redraw) is agg


def test_stats_and_selections():
  block, flat, valid, _ = _block(seed=5)
  _, _, st = _run(robust.trimmed_mean(beta=0.3), block)
  np.testing.assert_array_equal(st["trimmed"], [2 * 2, 2 * 2, 2 * 1, 0])   # floor(0.3 n) per side
  _, _, st = _run(robust.krum(f=1), block)
  np.testing.assert_array_equal(st["krum_selected"], [8, 6, 3, 0])          # n - f
  sel = np.asarray(robust.krum_selection(block, f=1, m=2))
  for p in range(3):
    slots = np.flatnonzero(valid[p])
    assert set(slots[ref_krum_sel(flat[p][slots], 1, 2)]) == set(np.flatnonzero(sel[p]))
    assert 0 not in np.flatnonzero(sel[p])     # the outlier (slot 0, when valid) is never chosen
  _, _, st = _run(robust.norm_bound(tau=2.0), block)
  norms = np.linalg.norm(flat, axis=-1)
  np.testing.assert_array_equal(st["norm_bounded"], ((norms > 2.0) & valid).sum(1))


def test_bad_input_is_refused():
  with pytest.raises(ValueError, match=r"beta=0.5 must be in \[0, 0.5\)"):
    robust.trimmed_mean(beta=0.5)
  with pytest.raises(ValueError, match="f=-1 must be a non-negative integer"):
    robust.krum(f=-1)
  with pytest.raises(ValueError, match="m=0 must be at least 1"):
    robust.krum(f=1, m=0)
  with pytest.raises(ValueError, match="krum: weighted='yes' must be True"):
    robust.krum(f=1, weighted="yes")
  with pytest.raises(ValueError, match="center='x'; choose one of"):
    robust.centered_clip(tau=1.0, center="x")
  with pytest.raises(ValueError, match=r"fltrust: trusted=\[\] must name at least one child"):
    robust.fltrust(trusted=[])
  with pytest.raises(ValueError, match="tau=0.0 must be positive"):
    robust.norm_bound(tau=0.0)
  with pytest.raises(ValueError, match=r"aggregator 'mode' is unknown; choose one of \['bulyan'"):
    sections.robust_aggregator("mode")
  with pytest.raises(ValueError, match="aggregator 'median': bad hyperparameters"):
    sections.robust_aggregator("median", beta=0.1)
  block = _block(k=6, counts=(6, 5))[0]
  with pytest.raises(ValueError, match="krum: f=2 needs at least 7 updates per parent, but the largest"):
    robust.krum(f=2).aggregate(block, {}, None)
  with pytest.raises(ValueError, match="bulyan: f=1 needs at least 7 updates"):
    robust.bulyan(f=1).aggregate(block, {}, None)


def test_hyperparameters_may_be_traced():
  """``beta``, ``f`` and ``tau`` as traced values (sweep axes): one compile for several values."""
  block, flat, valid, _ = _block(seed=1)
  traces = []

  @jax.jit
  def run(beta, f):
    traces.append(1)
    s, w, _ = robust.trimmed_mean(beta=beta).aggregate(block, {}, None)
    sk, wk, _ = robust.krum(f=f, m=1).aggregate(block, {}, None)
    return s["b"] / w[:, None], sk["b"] / wk[:, None]

  for beta, f in [(0.1, 1), (0.3, 2)]:
    tm, kr = run(jnp.float32(beta), jnp.int32(f))
    x = flat[0][valid[0]]
    np.testing.assert_allclose(np.asarray(tm[0]), ref_trimmed(x, beta)[6:], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(kr[0]), ref_krum(x, f, 1)[6:], rtol=2e-5, atol=2e-5)
  assert len(traces) == 1


def test_benchmark_smallest_setting_runs(tmp_path):
  """benchmarks/robust.py at a tiny size (no timing asserted): every aggregator ran, ratios to the
  mean and the block sizes are reported."""
  from benchmarks import robust as bench

  rows = bench.main(["--params=8", "--parents=2", "--cohorts=4", "--repeats=1", "--tag=t",
                     f"--out-dir={tmp_path}"])
  assert [r["aggregator"] for r in rows] == ["mean", "median", "trimmed_mean", "multi_krum", "rfa"]
  assert all("seconds" in r and r["x_mean"] > 0 for r in rows)
  assert (tmp_path / "t.json").exists()
  assert bench.largest_cohort(400, 2, True, 10**6) < bench.largest_cohort(400, 2, False, 10**6)


@pytest.mark.parametrize("name", ["fedtree.toolbox.robust", "fedtree.toolbox.attacks"])
def test_docstring_examples_run(name):
  import doctest
  import importlib

  result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, verbose=False)
  assert result.attempted > 0 and result.failed == 0
