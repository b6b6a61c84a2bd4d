"""fedtree.core.tier: chunked cohorts give the unchunked result, persistent client state is
scattered back by client, parent-aligned and step-sorted chunks train like gathered ones, and a
round compiles once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import count_traces, tier_kw
from perf_problems import flat_params, make_fedavg, make_hierfavg, run_rounds, tiny_data

from fedtree.core.local import ClientUpdate
from fedtree.core.loop import compile_rounds
from fedtree.core.sampling import cohort_sampler


@pytest.mark.parametrize("cohort_size", [None, 7])
def test_fedavg_chunked_equals_unchunked(cohort_size):
  data = tiny_data(10)
  ref_state, ref_m = run_rounds(make_fedavg(data, cohort_size=cohort_size), data)
  ref = flat_params(ref_state)
  assert np.all(np.isfinite(ref))  # NaN padding was never read
  for chunk in (1, 3, 4, 10):  # 3 and 4 do not divide the cohort: padded slots
    state, m = run_rounds(make_fedavg(data, cohort_size=cohort_size, chunk_size=chunk), data)
    np.testing.assert_allclose(flat_params(state), ref, rtol=2e-5, atol=2e-6,
                               err_msg=f"chunk={chunk}")
    np.testing.assert_allclose(np.asarray(m["train_loss"]), np.asarray(ref_m["train_loss"]),
                               rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(m["clients_trained"]),
                                  np.asarray(ref_m["clients_trained"]))


def test_hierfavg_chunked_equals_unchunked():
  data = tiny_data(10, seed=1)
  sizes = [[3, 2], [5]]
  ref = flat_params(run_rounds(make_hierfavg(data, sizes), data, rounds=4)[0])
  for chunk in (2, 3):
    got = flat_params(run_rounds(make_hierfavg(data, sizes, chunk_size=chunk), data, rounds=4)[0])
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6, err_msg=f"chunk={chunk}")


def test_persistent_state_scattered_back_by_client_for_any_chunk():
  """Client state: trained clients get their own update, others and padding write nothing."""
  data = tiny_data(9)

  def apply(anchor, state, cdata, num_steps, key):
    # state counts visits and remembers n; params move by the client's own n
    moved = jax.tree.map(lambda a: a - cdata.n.astype(a.dtype), anchor)
    return moved, {"visits": state["visits"] + 1, "n": cdata.n}, cdata.n.astype(jnp.float32)

  params = {"w": jnp.zeros((1, 2))}
  sampler_full = cohort_sampler(np.zeros(9, np.int64), 5)
  out = []
  for chunk in (None, 2, 5):
    sampler = cohort_sampler(np.zeros(9, np.int64), 5, chunk_size=chunk)
    cohort = sampler(jax.random.key(3))
    state0 = {"visits": jnp.zeros(9, jnp.int32), "n": jnp.full(9, -1, jnp.int32)}
    res = tier_kw(ClientUpdate(apply), params, cohort, data, num_steps=data.n_train,
                       weights=jnp.ones(9), key=jax.random.key(0), client_state=state0,
                       chunk_size=sampler.chunk_size)
    chosen = np.asarray(cohort.clients)[np.asarray(cohort.valid)]
    full = np.asarray(sampler_full(jax.random.key(3)).clients)
    np.testing.assert_array_equal(np.sort(chosen), np.sort(full))
    visits = np.asarray(res.client_state["visits"])
    assert visits.sum() == 5 and set(np.flatnonzero(visits)) == set(chosen.tolist())
    n_state = np.asarray(res.client_state["n"])
    np.testing.assert_array_equal(n_state[chosen], np.asarray(data.n_train)[chosen])
    assert np.all(n_state[visits == 0] == -1)
    assert int(res.num_trained) == 5
    np.testing.assert_allclose(float(res.weight_sum[0]), 5.0)
    np.testing.assert_allclose(np.asarray(res.delta_sum["w"])[0],
                               np.asarray(data.n_train)[chosen].sum())
    out.append(float(res.loss_sum))
  assert out[0] == out[1] == out[2]


def test_round_compiles_once():
  data = tiny_data(8)
  alg = make_fedavg(data, chunk_size=3, cohort_size=5)
  counted, traces = count_traces(alg)
  step = compile_rounds(counted, 2)
  state = counted.init(jax.random.key(0))
  for _ in range(5):
    state, _ = step(state, data, jax.random.key(1))
  jax.block_until_ready(state)
  assert len(traces) == 1 and int(state.round) == 10
  assert step._cache_size() == 1


def test_parent_aligned_chunks_train_like_gathered_ones():
  """The broadcast of a chunk's one parent gives what per-client gathers give, and a tree
  whose chunks are parent-aligned trains like the unchunked (gathered) tree."""
  data = tiny_data(8, seed=2)

  def apply(anchor, state, cdata, num_steps, key):  # params move by the client's own n
    return jax.tree.map(lambda a: a * 0.5 - cdata.n.astype(a.dtype), anchor), state, jnp.zeros(())

  params = {"w": jnp.arange(6.0).reshape(3, 2)}
  parent = np.repeat(np.arange(3), [2, 4, 2])
  sampler = cohort_sampler(parent, None, chunk_size=2)
  assert sampler.parent_aligned
  cohort = sampler(jax.random.key(0))
  kw = dict(num_steps=data.n_train, weights=jnp.arange(1.0, 9.0), key=jax.random.key(0),
            chunk_size=2, anchor_params={"w": jnp.ones((3, 2))})
  a = tier_kw(ClientUpdate(apply), params, cohort, data, parent_aligned=True, **kw)
  b = tier_kw(ClientUpdate(apply), params, cohort, data, parent_aligned=False, **kw)
  np.testing.assert_array_equal(a.delta_sum["w"], b.delta_sum["w"])
  np.testing.assert_array_equal(a.weight_sum, b.weight_sum)
  sizes = [[4, 4]]
  ref = flat_params(run_rounds(make_hierfavg(data, sizes), data, rounds=3)[0])  # one chunk: gathers
  got = flat_params(run_rounds(make_hierfavg(data, sizes, chunk_size=4), data, rounds=3)[0])
  np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


def test_slots_sorted_by_steps_return_in_cohort_order_and_padding_takes_no_step():
  data = tiny_data(7, seed=3)

  def apply(anchor, state, cdata, num_steps, key):  # the model records its own step count
    return jax.tree.map(lambda a: a + num_steps.astype(a.dtype), anchor), state, jnp.zeros(())

  params = {"w": jnp.zeros((1, 3))}
  steps = jnp.asarray([5, 1, 4, 1, 3, 2, 0], jnp.int32)
  sampler = cohort_sampler(np.zeros(7, np.int64), None, chunk_size=3)  # 7 clients + 2 padding
  cohort = sampler(jax.random.key(0))
  res = tier_kw(ClientUpdate(apply), params, cohort, data, num_steps=steps,
                     weights=jnp.ones(7), key=jax.random.key(0), chunk_size=3,
                     keep_client_params=True)
  got = np.asarray(res.client_params["w"])[:, 0]
  want = np.where(np.asarray(cohort.valid), np.asarray(steps)[np.asarray(cohort.clients)], 0)
  np.testing.assert_array_equal(got, want)  # slot order kept; padding slots ran 0 steps
  np.testing.assert_allclose(np.asarray(res.delta_sum["w"])[0], -float(steps.sum()))
