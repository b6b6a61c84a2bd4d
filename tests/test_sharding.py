"""The client axis sharded over a Mesh: 8 fake CPU devices give the 1-device result.

The 8-device part runs in a subprocess with ``--xla_force_host_platform_device_count=8`` set
before JAX starts (this test process has one CPU device).
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from perf_problems import dp_path, flat_params, make_fedavg, make_hierfavg, run_rounds, secagg_path, tiny_data

from fedtree.core import sharding

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKER = textwrap.dedent("""
  import json, sys, tempfile
  import jax, numpy as np
  from perf_problems import (dp_path, flat_params, make_fedavg, make_hierfavg, run_rounds, secagg_path,
                             stream_scaffold, tiny_data)
  from fedtree.core import sharding
  assert jax.device_count() == 8, jax.devices()
  mesh = sharding.client_mesh()
  data = sharding.shard_data(tiny_data(16, seed=2), mesh)
  assert len(data.x_train.sharding.device_set) == 8
  out = {}
  with jax.set_mesh(mesh):
    assert sharding.mesh_size() == 8
    state, m = run_rounds(make_fedavg(data, chunk_size=8, cohort_size=12), data)
    out["fedavg"] = flat_params(state).tolist()
    out["fedavg_loss"] = np.asarray(m["train_loss"]).tolist()
    state, _ = run_rounds(make_hierfavg(data, [[4, 4], [8]], chunk_size=8), data, rounds=4)
    out["hierfavg"] = flat_params(state).tolist()
    state, _ = run_rounds(make_fedavg(data, chunk_size=8, cohort_size=12, update_paths=dp_path()), data)
    out["fedavg_dp"] = flat_params(state).tolist()
    state, _ = run_rounds(make_fedavg(data, chunk_size=8, cohort_size=12, update_paths=secagg_path()), data)
    out["fedavg_secagg"] = flat_params(state).tolist()
    with tempfile.TemporaryDirectory() as tmp:
      out["stream_mesh"] = [a.tolist() for a in stream_scaffold(tmp, mesh)]
  with tempfile.TemporaryDirectory() as tmp:
    out["stream_one"] = [a.tolist() for a in stream_scaffold(tmp)]
  print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def eight_devices():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([ROOT, HERE]))
  proc = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
  return json.loads(line[len("RESULT"):])


def test_eight_fake_devices_match_one_device(eight_devices):
  data = tiny_data(16, seed=2)
  state, m = run_rounds(make_fedavg(data, chunk_size=8, cohort_size=12), data)
  np.testing.assert_allclose(eight_devices["fedavg"], flat_params(state), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(eight_devices["fedavg_loss"], np.asarray(m["train_loss"]), rtol=1e-5)
  state, _ = run_rounds(make_hierfavg(data, [[4, 4], [8]], chunk_size=8), data, rounds=4)
  np.testing.assert_allclose(eight_devices["hierfavg"], flat_params(state), rtol=1e-5, atol=1e-6)


def test_privacy_noise_on_eight_devices_matches_one_device(eight_devices):
  """Clipping and central noise (issue 43 item 5): the noise is drawn per parent from the round's
  key, the same on any mesh (a different draw would move the models by the noise's std, 0.1 here,
  not by float rounding), so the only gap is the one of the plain case: the cross-device sum of
  the clipped deltas (docs/scaling.md)."""
  data = tiny_data(16, seed=2)
  state, _ = run_rounds(make_fedavg(data, chunk_size=8, cohort_size=12, update_paths=dp_path()), data)
  plain, _ = run_rounds(make_fedavg(data, chunk_size=8, cohort_size=12), data)
  assert np.max(np.abs(flat_params(state) - flat_params(plain))) > 1e-2   # the noise is there
  np.testing.assert_allclose(eight_devices["fedavg_dp"], flat_params(state), rtol=1e-5, atol=1e-6)


def test_secure_sum_on_eight_devices_matches_one_device(eight_devices):
  """SecAgg's modular sum with the chunk's slots over 8 devices: every device sums its slice into its
  own row of the field and the rows are summed once, modulo 2^32; the field's sum is exact, so the
  gap is only the training's (the plain case's)."""
  data = tiny_data(16, seed=2)
  state, _ = run_rounds(make_fedavg(data, chunk_size=8, cohort_size=12, update_paths=secagg_path()), data)
  np.testing.assert_allclose(eight_devices["fedavg_secagg"], flat_params(state), rtol=1e-5, atol=1e-6)


def test_a_streamed_population_over_eight_devices_is_the_one_device_run(eight_devices):
  """A population streamed from a store over a mesh (issue 49 item 6; fedtree.population.stream.layout):
  each call's window spread over the 8 devices, the paged control variates gathered and scattered per
  process, ends where the one-device streamed run ends: the same model, and control variates within
  float32 rounding (6e-8 apart on a few coordinates, under XLA's default flags too: a device computes its
  few rows in another vectorized order), as the resident run over a mesh does."""
  for got, want in zip(eight_devices["stream_mesh"], eight_devices["stream_one"], strict=True):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_one_device_mesh_is_transparent():
  mesh = sharding.client_mesh(1)
  assert sharding.mesh_size(mesh) == 1 and sharding.mesh_size() == 1
  data = tiny_data(6, seed=3)
  ref = flat_params(run_rounds(make_fedavg(data, chunk_size=3), data)[0])
  with jax.set_mesh(mesh):
    sdata = sharding.shard_data(data, mesh)
    got = flat_params(run_rounds(make_fedavg(sdata, chunk_size=3), sdata)[0])
  np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_client_mesh_validation():
  with pytest.raises(ValueError, match="asks for 2 devices; 1 exist"):
    sharding.client_mesh(2)
  with pytest.raises(ValueError, match="only a 1-D client mesh"):
    sharding.client_mesh((1, 1))
  mesh = sharding.client_mesh([1])
  assert mesh.axis_names == (sharding.CLIENT_AXIS,)
  x = sharding.shard_clients({"a": np.zeros((3, 2))}, mesh)["a"]
  assert x.shape == (3, 2)


def test_config_fields_mesh_auto_chunk_and_bf16(tmp_path):
  """``mesh_shape``, ``chunk_size="auto"`` and ``compute_dtype`` run end to end from a config."""
  from config_files import load_config

  from fedtree.experiment.runner import train_and_evaluate

  cfg = load_config("quickstart")
  cfg.rounds, cfg.eval_every, cfg.rounds_per_call, cfg.progress = 2, 2, 2, False
  cfg.mesh_shape = 1
  cfg.chunk_size = "auto"
  cfg.compute_dtype = "bfloat16"
  del cfg.runs["fedadam"], cfg.runs["edges_only"]
  cfg.run_order = ("fedavg", "hierfavg")
  cfg.runs.hierfavg.chunk_size = 5
  results = train_and_evaluate(cfg, str(tmp_path))
  assert set(results) == {"fedavg", "hierfavg"}
  assert np.isfinite(results["fedavg"]["global"]["loss"])


def test_host_helpers_in_one_process():
  """In one process nothing spans processes: ``local_copy`` is the identity (keys included),
  ``to_host`` gives numpy copies, ``barrier`` returns at once, and a stop request is this
  process's own (``agreed`` returns it unwrapped: no collective per call)."""
  tree = {"w": jax.numpy.arange(6.0).reshape(3, 2), "key": jax.random.key(0)}
  assert sharding.local_copy(tree) is tree
  host = sharding.to_host({"w": tree["w"], "n": jax.numpy.int32(3)})
  assert isinstance(host["w"], np.ndarray) and host["w"].tolist() == [[0, 1], [2, 3], [4, 5]]
  assert isinstance(host["n"], np.ndarray) and int(host["n"]) == 3
  sharding.barrier("test")
  assert sharding.any_process(True) is True and sharding.any_process(False) is False

  def stop():
    return False

  assert sharding.agreed(stop) is stop and sharding.agreed(None) is None
