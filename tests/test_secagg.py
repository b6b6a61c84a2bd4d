"""Secure aggregation's numerics (fedtree.toolbox.secagg): the b-bit field in uint32, the fixed-point
and distributed encodings, the modular sum per parent against numpy and against a client-by-client
protocol with masks and Shamir shares (tests/reference_secagg.py), dropout recovery, the rotation,
conditional rounding and the bytes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference_secagg as ref
from helpers import count_traces

from fedtree.algorithms import fedavg, hierfavg
from fedtree.core.local import LocalSchedule
from fedtree.core.topology import Topology
from fedtree.core.updates import Aggregator, Chunk, ClientContext, ClientTransform, UpdatePath, chain
from fedtree.datasets.synthetic import grouped_synthetic
from fedtree.models import build_model
from fedtree.toolbox import compression, robust, secagg
from fedtree.toolbox import distributed_dp as ddp


# ------------------------------------------------------------------------ the field
@pytest.mark.parametrize("bits", [1, 8, 12, 31, 32])
def test_field_is_the_integers_modulo_2_to_the_bits(bits):
  rng = np.random.default_rng(bits)
  mod = 2 ** bits
  a = rng.integers(0, mod, size=(50, 7), dtype=np.uint64)
  seg = rng.integers(0, 3, size=50)
  got = np.asarray(secagg.field_sum(jnp.asarray(a, jnp.uint32), jnp.asarray(seg), 3, bits))
  want = np.stack([a[seg == p].sum(axis=0, dtype=object) % mod for p in range(3)]).astype(np.uint64)
  np.testing.assert_array_equal(got, want)
  # add and the signed reading; the edges of the range
  half = mod // 2
  x = np.array([0, 1, -1, half - 1, -half] if bits > 1 else [0, -1], np.int64)
  u = secagg.to_field(jnp.asarray(x, jnp.int32), bits)
  np.testing.assert_array_equal(np.asarray(u, np.int64), x % mod)
  np.testing.assert_array_equal(np.asarray(secagg.centered(u, bits)), x)
  top = secagg.to_field(jnp.asarray([half - 1], jnp.int32), bits)
  one = secagg.to_field(jnp.asarray([1], jnp.int32), bits)
  assert int(secagg.centered(secagg.field_add(top, one, bits), bits)[0]) == -half   # wraps at the bound


def test_bits_out_of_range_are_refused():
  for bad in (0, 33, 2.5, True):
    with pytest.raises(ValueError, match=r"bits=.* must be an integer in \[1, 32\]"):
      secagg.field_mask(bad)


# ------------------------------------------------------------------------ the fixed-point encoding
def _encode_sum(enc, values, parents, num, key=0):
  """Every row of ``values`` encoded (its own key), summed per parent in the field, decoded."""
  k = values.shape[0]
  keys = jax.random.split(jax.random.key(key), k)
  rot = jax.random.key(7)
  fields, _ = jax.vmap(lambda v, kk: enc.encode(v, kk, rot, jnp.int32(0)))(
    jnp.asarray(values, jnp.float32), keys)
  total = secagg.field_sum(fields, jnp.asarray(parents), num, enc.bits)
  return np.asarray(jax.vmap(lambda t: enc.decode(t, rot, 0, values.shape[1]))(total), np.float64)


def test_deterministic_fixed_point_sum_within_half_a_step_per_client():
  """With no overflow the decoded sum is the sum of the rounded values, within n γ/2 of the plain
  sum; values half a step off the grid meet the bound."""
  enc = secagg.fixed_point(bits=32, clip_range=8.0, quant_bits=22, rounding="deterministic")
  gamma = secagg.step(8.0, 22)
  rng = np.random.default_rng(0)
  x = rng.uniform(-2, 2, size=(6, 40))
  x[:, 0] = (np.arange(6) + 0.5) * gamma * 0.999   # just below half a step: rounds down
  parents = np.array([0, 0, 0, 1, 1, 1])
  got = _encode_sum(enc, x, parents, 2)
  plain = np.stack([x[:3].sum(0), x[3:].sum(0)])
  rounded = np.stack([np.round(np.float32(x[i]) / np.float32(gamma)) for i in range(6)])
  want = np.stack([rounded[:3].sum(0), rounded[3:].sum(0)]) * gamma
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  assert np.max(np.abs(got - plain)) <= 3 * gamma / 2 * (1 + 1e-4)


def test_stochastic_fixed_point_is_unbiased():
  """The mean over N keys of the decoded sum of 4 clients is the plain sum within 6 standard errors
  (each client's rounding error has variance at most γ²/4)."""
  enc = secagg.fixed_point(bits=16, clip_range=1.0, quant_bits=8)
  gamma = secagg.step(1.0, 8)
  x = np.random.default_rng(1).uniform(-0.2, 0.2, size=(4, 30))
  n_keys = 400
  rot = jax.random.key(7)

  @jax.jit
  def one(key):
    fields, _ = jax.vmap(lambda v, k: enc.encode(v, k, rot, 0))(jnp.asarray(x, jnp.float32),
                                                               jax.random.split(key, 4))
    return enc.decode(secagg.field_sum(fields, jnp.zeros(4, jnp.int32), 1, enc.bits)[0], rot, 0, 30)

  sums = np.asarray(jax.vmap(one)(jax.random.split(jax.random.key(0), n_keys)), np.float64)
  err = sums.mean(0) - x.sum(0)
  assert np.max(np.abs(err)) <= 6 * math.sqrt(4 * gamma ** 2 / 4 / n_keys)
  assert np.max(np.abs(sums - x.sum(0))) <= 4 * gamma   # each client off by less than one step


def test_the_sum_wraps_at_the_bound():
  """An 8-bit field at the grid of 8 bits: sums up to 127 steps decode; 128 wrap to -128."""
  enc = secagg.fixed_point(bits=8, clip_range=127.0, quant_bits=8, rounding="deterministic")   # γ = 1
  x = np.array([[100.0, 100.0, -100.0], [27.0, 28.0, -28.0]])
  got = _encode_sum(enc, x, np.zeros(2, int), 1)[0]
  np.testing.assert_array_equal(got, [127.0, -128.0, -128.0])
  # and the accumulator reports the wrapped coordinates
  agg = secagg.secure_sum(enc)
  acc = agg.accumulate(1, None)
  fields = jax.vmap(lambda v: enc.encode(v, jax.random.key(0), jax.random.key(0), 0)[0])(
    jnp.asarray(x, jnp.float32))
  st = acc.add(acc.init({"w": jnp.zeros((1, 3))}, 1, jnp.float32),
               Chunk(fields, jnp.ones(2), jnp.zeros(2, jnp.int32), jnp.arange(2), jnp.arange(2),
                     jnp.ones(2, bool)))
  node = secagg.recovery().init(None, 1)
  delta, weight, stats = acc.finish(st, jax.random.key(0), node)
  np.testing.assert_array_equal(np.asarray(delta["w"][0]), [127.0, -128.0, -128.0])
  # 128 wrapped; -128 is the field's own lowest value
  assert float(weight[0]) == 2 and float(stats["secagg_overflow"][0]) == pytest.approx(1 / 3)


def test_clipping_to_the_range_and_its_statistic():
  enc = secagg.fixed_point(bits=32, clip_range=1.0, quant_bits=16, rounding="deterministic")
  v = jnp.asarray([0.5, 3.0, -7.0, 0.0])
  field, stats = enc.encode(v, jax.random.key(0), jax.random.key(0), 0)
  np.testing.assert_allclose(np.asarray(enc.decode(field, None, 0, 4)), [0.5, 1.0, -1.0, 0.0], atol=1e-4)
  assert float(stats["secagg_clipped"]) == 0.5


@pytest.mark.parametrize("kw,match", [
  (dict(clip_range=0.0), "clip_range=0.0 must be a finite number > 0"),
  (dict(quant_bits=25), r"quant_bits=25 must be an integer in \[2, 24\]"),
  (dict(bits=12, quant_bits=13), r"quant_bits=13 must be an integer in \[2, 12\]"),
  (dict(rounding="up"), r"rounding='up'; choose one of \['stochastic', 'deterministic'\]"),
])
def test_bad_encodings_are_named(kw, match):
  with pytest.raises(ValueError, match=match):
    secagg.fixed_point(**kw)


# ------------------------------------------------------------------------ against the protocol
@pytest.mark.parametrize("neighbours,threshold", [(None, 0.5), (None, 0.8), (2, 0.6), (4, 0.5)])
def test_modular_sum_and_recovery_match_the_masked_protocol(neighbours, threshold):
  """Clients' field vectors through the reference protocol (masks, Shamir shares, dropouts): the
  server's sum is the vectorized modular sum of the survivors', and the round fails exactly where
  the recovery rule says (placements on the ring as given)."""
  bits, n, length = 12, 9, 5
  rng = np.random.default_rng(3)
  vectors = [rng.integers(0, 2 ** bits, size=length) for _ in range(n)]
  outcomes = []
  for trial in range(12):
    dropped = set(rng.choice(n, size=int(rng.integers(0, 6)), replace=False).tolist())
    got = ref.secure_sum(vectors, dropped, bits, threshold, neighbours, seed=trial)
    alive = np.array([i not in dropped for i in range(n)])
    survivors = jnp.asarray([alive.sum()], jnp.float32)
    fail = bool(survivors[0] < math.ceil(threshold * n))
    if neighbours is not None:
      count = secagg.shareholders_alive(jnp.asarray(alive)[None], np.array([n]), neighbours)
      fail = fail or bool(jnp.any(count < math.ceil(threshold * (neighbours + 1))))
    assert (got is None) == fail, (dropped, got)
    outcomes.append(fail)
    if got is not None:
      u = jnp.asarray(np.stack([vectors[i] for i in range(n)]), jnp.uint32)
      mine = secagg.field_sum(jnp.where(jnp.asarray(alive)[:, None], u, 0), jnp.zeros(n, jnp.int32), 1, bits)
      np.testing.assert_array_equal(np.asarray(mine[0], np.int64), np.asarray(got, np.int64))
  assert any(outcomes) and not all(outcomes)


def test_recovery_fails_a_parent_below_the_threshold():
  node = secagg.recovery(cohort=np.array([4, 4, 10]), threshold=0.5)
  state = node.init(None, 3)
  delta = {"w": jnp.ones((3, 2))}
  reported = jnp.asarray([1.0, 2.0, 5.0])
  out, weight, new, stats = node.apply(delta, reported, {"reported": reported}, state, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(stats["secagg_failed"]), [1, 0, 0])
  np.testing.assert_array_equal(np.asarray(weight), [0, 2, 5])
  np.testing.assert_array_equal(np.asarray(out["w"]), [[0, 0], [1, 1], [1, 1]])
  assert not np.array_equal(np.asarray(new.rotation), np.asarray(state.rotation))   # a fresh key each round


def test_secagg_plus_random_placement_failure_rate():
  """Under SecAgg+ with 1 of 10 dropped and k = 2 (3 shareholders, 2 needed) no client loses two,
  so the round never fails; with 3 dropped at random it fails exactly when two dropped sit within
  one place of each other's shareholders: the frequency over placements matches the count over every
  placement (a ring of 10, 3 dropped: 1 - P(no two of them at distance <= 2))."""
  n, k = 10, 2
  fail1 = secagg.harary_failures(jax.random.key(0), jnp.full((200,), 9.0), np.full(200, n), k,
                                 np.full(200, 2))
  assert not bool(jnp.any(fail1))
  trials = 4000
  fail = secagg.harary_failures(jax.random.key(1), jnp.full((trials,), 7.0), np.full(trials, n), k,
                                np.full(trials, 2))
  import itertools
  bad = 0
  combos = list(itertools.combinations(range(n), 3))
  for c in combos:
    alive = np.ones(n, bool)
    alive[list(c)] = False
    count = secagg.shareholders_alive(jnp.asarray(alive)[None], np.array([n]), k)
    bad += bool(jnp.any(count < 2))
  p = bad / len(combos)
  assert abs(float(jnp.mean(fail)) - p) <= 5 * math.sqrt(p * (1 - p) / trials)


@pytest.mark.parametrize("kw,match", [
  (dict(threshold=0.0), r"threshold=0.0 must be in \(0, 1\]"),
  (dict(threshold=1.5), r"threshold=1.5 must be in \(0, 1\]"),
  (dict(neighbours=3), "neighbours=3 must be an even integer >= 2"),
  (dict(neighbours=0), "neighbours=0 must be an even integer >= 2"),
])
def test_bad_protocol_settings_are_named(kw, match):
  with pytest.raises(ValueError, match=match):
    secagg.recovery(**kw)


# ------------------------------------------------------------------------ bytes
def test_secagg_bytes_grow_linearly_per_client_and_secagg_plus_logarithmically():
  n = np.array([10, 100, 1000])
  up, down = secagg.exchange_bytes(n)
  per = secagg.exchange_bytes(n[:1] * 0 + 2)[0][0] - secagg.exchange_bytes(1)[0]   # one more neighbour
  np.testing.assert_allclose(np.diff(up) / np.diff(n), per)   # linear in n: O(n) a client, O(n^2) in all
  k = 2 * np.ceil(np.log2(n)).astype(int)
  plus = np.array([secagg.exchange_bytes(c, int(kk))[0] for c, kk in zip(n, k, strict=True)])
  np.testing.assert_allclose(plus, 2 * secagg.KEY_BYTES + k * per)
  assert np.all(plus[1:] < up[1:])
  assert float(secagg.exchange_bytes(0)[0]) == 0.0
  assert secagg.masked_bytes(22, 5) == 14.0   # 110 bits, packed
  np.testing.assert_allclose(secagg.client_ops(10, 100, threshold=0.5), 10 * 100 + 2 * 9 * 5)


# ------------------------------------------------------------------------ rotation and rounding
def test_rotation_round_trip_and_norm():
  x = jax.random.normal(jax.random.key(0), (37,))
  key = jax.random.key(3)
  y = secagg.rotate(x, key)
  assert y.shape == (64,)
  np.testing.assert_allclose(float(jnp.linalg.norm(y)), float(jnp.linalg.norm(x)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(secagg.unrotate(y, key, 37)), np.asarray(x), atol=1e-5)


def test_conditional_rounding_keeps_the_bound_and_gives_up_to_zeros():
  y = jax.random.normal(jax.random.key(0), (256,)) * 3
  m = ddp.mechanism("ddg", bits=16, clip=1.0, noise_multiplier=1.0, cohort=5, survivors=5, dim=256)
  bound = (float(jnp.linalg.norm(y)) / 1.0) ** 2 + 256 / 4 + math.sqrt(2 * math.log(1 / m.beta)) * (
    float(jnp.linalg.norm(y)) + 8)
  z, tries, ok = secagg.conditional_round(y, jax.random.key(1), bound)
  assert bool(ok) and float(jnp.sum(z.astype(jnp.float32) ** 2)) <= bound
  assert bool(jnp.all(jnp.abs(z - y) < 1))
  z, tries, ok = secagg.conditional_round(y, jax.random.key(1), 1.0, max_tries=3)   # impossible bound
  assert not bool(ok) and int(tries) == 3 and not bool(jnp.any(z))


# ------------------------------------------------------------------------ in a round
def _problem():
  data, groups = grouped_synthetic(group_sizes=(6, 4), dim=8, num_classes=3, seed=2)
  model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
  return data, groups, model


def _path(enc, cohort=None, threshold=0.5, neighbours=None, client_first=None):
  return UpdatePath(client=chain(client_first, secagg.client(enc)), aggregator=secagg.secure_sum(enc),
                    node=secagg.recovery(cohort=cohort, threshold=threshold, neighbours=neighbours))


def test_fedavg_through_a_wide_field_equals_plain_fedavg_within_the_grid_and_compiles_once():
  data, _, model = _problem()
  enc = secagg.fixed_point(bits=32, clip_range=8.0, quant_bits=22, rounding="deterministic")

  def alg(path):
    return fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1),
                  schedule=LocalSchedule(batch_size=8, steps=2), weighting="uniform", update_paths=path,
                  cohort_size=7)

  plain, secure = alg(None), alg(_path(enc, cohort=np.array([7])))
  counted, traces = count_traces(secure)
  step = jax.jit(counted.round)
  s0, s1 = plain.init(jax.random.key(0)), counted.init(jax.random.key(0))
  for r in range(3):
    s0, _ = jax.jit(plain.round)(s0, data, jax.random.key(r))
    s1, m = step(s1, data, jax.random.key(r))
  assert len(traces) == 1
  pairs = zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params), strict=True)
  gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs)
  assert gap <= 3 * secagg.step(8.0, 22)   # each round's mean within γ/2 (losses differ a little after)
  assert float(m["secagg_overflow"]) == 0 and float(m["secagg_failed"]) == 0
  assert float(m["uplink_bytes"]) == secagg.masked_bytes(32, 27) + 0.0   # the client reports its vector


def test_secure_sum_of_example_weighted_updates_is_the_weighted_mean():
  """With example weights the clients encode ``w Δ`` and the parent divides the decoded sum by
  ``Σ w``: the weighted mean, within the grid."""
  data, groups, model = _problem()
  topo = Topology.from_labels(groups)
  enc = secagg.fixed_point(bits=32, clip_range=64.0, quant_bits=24, rounding="deterministic")

  def alg(path):
    return hierfavg(model=model, data=data, topology=topo, local_optimizer=optax.sgd(0.1),
                    schedule=LocalSchedule(batch_size=8, steps=1), weighting="examples", update_paths=path)

  s0, _ = jax.jit(alg(None).round)(alg(None).init(jax.random.key(0)), data, jax.random.key(1))
  s1, _ = jax.jit(alg(_path(enc)).round)(alg(_path(enc)).init(jax.random.key(0)), data, jax.random.key(1))
  for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=secagg.step(64.0, 24))


def test_compression_before_encoding_and_the_bytes_it_replaces():
  """QSGD's decoded update is what is encoded; what travels is the field vector (its bytes replace
  the compressor's); any other statistic reported twice is still refused."""
  data, _, model = _problem()
  enc = secagg.fixed_point(bits=24, clip_range=4.0, quant_bits=20)
  q = compression.uplink(compression.qsgd(bits=4))
  path = _path(enc, client_first=q)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1),
               schedule=LocalSchedule(batch_size=8, steps=1), weighting="uniform", update_paths=path)
  _, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
  assert float(m["uplink_bytes"]) == secagg.masked_bytes(24, 27)
  twice = ClientTransform(lambda d, s, k, c: (d, s, {"secagg_clipped": jnp.zeros(())}), name="other")
  with pytest.raises(ValueError,
                     match="statistic 'secagg_clipped' of transform 'secure' is already reported"):
    chain(twice, secagg.client(enc)).apply(jnp.zeros(3), (), jax.random.key(0), ClientContext(
      jnp.int32(0), jnp.int32(0), jnp.float32(1), {"secure": secagg.recovery().init(None, 1)}))


def test_a_robust_aggregator_is_refused_by_name():
  for agg in (robust.median(), robust.krum(f=1)):
    with pytest.raises(ValueError, match=rf"cannot compose with aggregator '{agg.name}': it reads every "
                                         r"update of a parent's cohort .* reveals only their sum"):
      secagg.check_aggregator(agg)
  secagg.check_aggregator(Aggregator())   # the mean: replaced by the secure sum


def test_dropouts_fail_the_round_at_a_parent_and_the_row_says_so():
  """HierFAVG with the systems capability's dropouts (the root aggregating every 2 rounds, so the
  edges' models after round 1 are their own): an edge whose survivors fall below the threshold
  keeps its model (weight 0), and ``secagg_failed`` (the fraction of edges) counts exactly those."""
  from fedtree.toolbox import systems as sysm

  data, groups, model = _problem()
  topo = Topology.from_labels(groups)
  enc = secagg.fixed_point(bits=32)
  systems = sysm.Systems(profile=sysm.device_profile(jax.random.key(0), data.num_clients),
                         policy=sysm.wait_for_all(dropout=0.5))
  alg = hierfavg(model=model, data=data, topology=topo, local_optimizer=optax.sgd(0.1),
                 schedule=LocalSchedule(batch_size=8, steps=1), weighting="uniform", cohort_size=4,
                 periods=(2,),
                 update_paths=_path(enc, cohort=np.array([4, 4]), threshold=0.75), systems=systems)
  state = alg.init(jax.random.key(0))
  step = jax.jit(alg.round)
  failed = []
  for seed in range(8):
    new, m = step(state, data, jax.random.key(seed))
    pairs = zip(jax.tree.leaves(new.params[1]), jax.tree.leaves(state.params[1]), strict=True)
    moved = sum(np.any(np.abs(np.asarray(a) - np.asarray(b)) > 0, axis=tuple(range(1, np.ndim(a))))
                for a, b in pairs) > 0
    assert float(m["secagg_failed"]) * 2 == np.sum(~moved), seed
    failed.append(float(m["secagg_failed"]))
  assert 0 < np.mean(failed) < 1


def test_the_protocols_compute_is_in_the_systems_clock_at_each_parents_cohort():
  """Two edges of 4 and 6 clients, every device alike: a round takes the plain round's seconds plus the
  protocol's field elements (masks of the vector's length, shares) at ``field_ops_per_second``, the
  larger edge's, the second (its clients are the slowest), as :func:`secagg.client_ops` counts them."""
  from fedtree.toolbox import systems as sysm

  data, groups, model = _problem()
  groups = 1 - groups   # the edge of 6 clients second
  topo = Topology.from_labels(groups)
  enc = secagg.fixed_point(bits=32)
  n = np.bincount(groups)
  masks, shares = n.astype(float), secagg.client_ops(n, 0)
  path = UpdatePath(client=secagg.client(enc, masks=masks, share_ops=shares),
                    aggregator=secagg.secure_sum(enc), node=secagg.recovery(cohort=n))
  profile = sysm.make_profile(np.full(data.num_clients, 5.0), np.full(data.num_clients, 1e3))

  def seconds(rate):
    systems = sysm.Systems(profile=profile, field_ops_per_second=rate)
    alg = hierfavg(model=model, data=data, topology=topo, local_optimizer=optax.sgd(0.1),
                   schedule=LocalSchedule(batch_size=8, steps=2), update_paths=path, systems=systems)
    _, m = jax.jit(alg.round)(alg.init(jax.random.key(0)), data, jax.random.key(1))
    return float(m["round_seconds"])

  length = enc.length(27)   # the logistic regression's 8 x 3 + 3 parameters
  want = secagg.client_ops(n, length)[1]
  assert n.tolist() == [4, 6] and want == np.max(masks * length + shares)
  np.testing.assert_allclose(seconds(1e3) - seconds(1e30), want / 1e3, rtol=1e-5)
  with pytest.raises(ValueError, match=r"field_ops_per_second=0.0 must be a finite number > 0"):
    sysm.Systems(profile=profile, field_ops_per_second=0.0)


def test_a_host_that_only_averages_refuses_the_secure_sum_by_name():
  """FedBuff scales its buffered clients' updates by staleness before summing them: a path whose
  aggregator is a secure sum is refused before anything compiles, naming it."""
  from fedtree.algorithms import fedbuff

  data, groups, model = _problem()
  enc = secagg.fixed_point()
  path = UpdatePath(client=secagg.client(enc), aggregator=secagg.secure_sum(enc))
  with pytest.raises(ValueError, match=r"fedbuff cannot use aggregator 'secure_sum\[fixed_point, 32 bits\]': "
                                       r"it scales every update by its staleness before the sum"):
    fedbuff(model=model, data=data, topology=Topology.from_labels(groups), local_optimizer=optax.sgd(0.1),
            schedule=LocalSchedule(batch_size=8, steps=1), buffer_size=2, concurrency=2, update_paths=path)
