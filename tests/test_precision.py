"""Mixed-precision local training: bf16 forward/backward, float32 carried params and server."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from perf_problems import flat_params, make_fedavg, run_rounds, tiny_data, tiny_model

from fedtree.core.local import Batch, SGDCarry, check_compute_dtype, make_sgd_step


def test_bf16_round_keeps_float32_state_and_tracks_float32():
  data = tiny_data(8, equal=True)
  ref_state, ref_m = run_rounds(make_fedavg(data, chunk_size=4), data, rounds=3)
  state, m = run_rounds(make_fedavg(data, chunk_size=4, compute_dtype="bfloat16"), data, rounds=3)
  for leaf in jax.tree.leaves((state.params, state.opt_state)):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      assert leaf.dtype == jnp.float32
  assert m["train_loss"].dtype == jnp.float32
  got, ref = flat_params(state), flat_params(ref_state)
  assert np.all(np.isfinite(got))
  rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
  assert 0 < rel < 2e-2, rel          # bf16 really used (not bit-equal), yet close
  np.testing.assert_allclose(np.asarray(m["train_loss"]), np.asarray(ref_m["train_loss"]),
                             rtol=3e-2)


def test_bf16_step_computes_in_bf16_and_updates_in_f32():
  model = tiny_model()
  params = model.init(jax.random.key(0))
  batch = Batch(x=jnp.ones((4, 6)), y=jnp.zeros(4, jnp.int32), mask=jnp.ones(4, bool))
  opt = optax.sgd(0.1)
  carry = SGDCarry(params=params, opt_state=opt.init(params), anchor=params)
  step = make_sgd_step(model, opt, compute_dtype="bfloat16")
  jaxpr = str(jax.make_jaxpr(step)(carry, batch, jax.random.key(1)))
  assert "bf16[4,8]" in jaxpr                  # the hidden layer runs in bfloat16
  new, loss = step(carry, batch, jax.random.key(1))
  assert loss.dtype == jnp.float32
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(new.params))
  new32, loss32 = make_sgd_step(model, opt)(carry, batch, jax.random.key(1))
  assert abs(float(loss) - float(loss32)) < 2e-2


def test_compute_dtype_validation():
  assert check_compute_dtype(None) is None
  assert check_compute_dtype("bfloat16") == jnp.bfloat16
  assert check_compute_dtype(jnp.bfloat16) == jnp.bfloat16
  with pytest.raises(ValueError, match="compute_dtype='int8'"):
    check_compute_dtype("int8")
