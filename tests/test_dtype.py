"""float64 from the config (issue 27 item 2): ``config.dtype="float64"`` (``--config.dtype=float64``)
makes every state of every algorithm float64, data included, with JAX's 64-bit mode on for the
run only; ``float32`` (the default) stays float32. The default run checks one algorithm per
that crashed (CFL: its int32 cluster count under x64); ``-m slow`` checks every other registered
algorithm, one per family and more, and the command line."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from multihost_config import get_config

from fedtree.core import loop
from fedtree.experiment import registry, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dtypes_after_a_round(name: str, dtype: str) -> dict:
  """The float dtypes of run ``name``'s state after one round, of its data and of its loss."""
  c = get_config(name)
  c.dtype = dtype
  c = runner.prepare_config(c)
  runner.validate_config(c)
  with runner.precision(c):
    ctx = runner.make_context(c)
    alg = registry.build_algorithm(name, c.runs[name], ctx)
    losses = []
    state = loop.run(alg, ctx.run_data, num_rounds=1, key=jax.random.key(0),
                     on_metrics=lambda r, m: losses.append(m.get("train_loss")))
    floats = {str(x.dtype) for x in jax.tree.leaves(state)
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)}
    models = {str(x.dtype) for nm in alg.models(state).values() for x in jax.tree.leaves(nm.params)}
    return dict(state=floats, models=models, x=str(ctx.data.x_train.dtype), x64=jax.config.jax_enable_x64,
                finite=all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state)
                           if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)))


def _check_float64(name):
  got = _dtypes_after_a_round(name, "float64")
  assert got["state"] == {"float64"} and got["models"] == {"float64"}, got
  assert got["x"] == "float64" and got["x64"] and got["finite"], got
  assert not jax.config.jax_enable_x64  # 64-bit mode was the run's only


def test_float64_state_of_cfl_whose_cluster_count_crashed_under_x64():
  _check_float64("cfl")


def test_float64_adaptive_clipping_keeps_its_clip_norm_in_float64_inside_fused_rounds():
  """Issue 43 item 2: ``--config.dtype=float64`` with adaptive clipping crashed in the fused
  rounds' scan (the clip norm started float32 and came out float64); it now starts in the
  run's dtype and stays there, and the clip norm moves (the state is not frozen)."""
  c = get_config("fedavg")
  c.dtype, c.rounds = "float64", 4
  c.runs.fedavg.weighting = "uniform"
  c.runs.fedavg.privacy = {"noise_multiplier": 0.5, "adaptive": {"initial_clip": 0.1, "count_noise": 1.0}}
  c = runner.prepare_config(c)
  with runner.precision(c):
    ctx = runner.make_context(c)
    alg = registry.build_algorithm("fedavg", c.runs.fedavg, ctx)
    start = alg.init(jax.random.key(0))
    state = loop.run(alg, ctx.run_data, num_rounds=4, rounds_per_call=2, key=jax.random.key(0))
    clip0, clip = start.update_state[0].node["dp"]["clip"], state.update_state[0].node["dp"]["clip"]
    assert clip0.dtype == clip.dtype == jnp.float64
    assert np.all(np.isfinite(np.asarray(clip))) and not np.allclose(np.asarray(clip), 0.1)
    floats = {str(x.dtype) for x in jax.tree.leaves(state)
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)}
    assert floats == {"float64"}, floats


def test_a_state_that_follows_the_model_is_never_narrower_than_float32():
  from fedtree.toolbox.privacy import Adaptive, central

  dp = central(1.0, normalize="count", adaptive=Adaptive(initial_clip=0.5))
  for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
    assert dp.init({"w": jnp.zeros(3, dtype)}, 2)["clip"].dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(registry.SPECS) - {"cfl"}))
def test_float64_state_of_every_other_algorithm(name):
  _check_float64(name)


def test_float32_is_the_default_and_a_bad_dtype_is_refused():
  c = runner.prepare_config(get_config("fedavg"))
  assert c.dtype == "float32"
  with runner.precision(c):
    ctx = runner.make_context(c)
    assert ctx.data.x_train.dtype == jnp.float32 and not jax.config.jax_enable_x64
  c = get_config("fedavg")
  c.dtype = "float16"
  with pytest.raises(ValueError, match=r"config.dtype='float16'; choose one of \('float32', 'float64'\)"):
    runner.validate_config(runner.prepare_config(c))


def test_float64_without_x64_is_a_clear_error():
  c = runner.prepare_config(get_config("fedavg"))
  c.dtype = "float64"
  with pytest.raises(ValueError, match="config.dtype='float64' needs JAX's 64-bit mode"):
    runner.make_context(c)


@pytest.mark.slow
def test_float64_from_the_command_line(tmp_path):
  """``--config.dtype=float64`` through ``fedtree.main``: the run's checkpoint holds float64
  parameters (and CFL, which crashed under x64, finishes)."""
  cmd = [sys.executable, "-m", "fedtree.main", "--config=tests/multihost_config.py:fedavg,cfl",
         f"--workdir={tmp_path}", "--config.dtype=float64"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float64"
  import orbax.checkpoint as ocp

  with jax.enable_x64(True), ocp.StandardCheckpointer() as ck:   # (without x64, float64 reads as float32)
    restored = ck.restore(tmp_path / "checkpoints" / "fedavg" / "2" / "default")
  dtypes = {str(np.asarray(x).dtype) for x in jax.tree.leaves(restored) if np.asarray(x).dtype.kind == "f"}
  assert dtypes == {"float64"}, dtypes
