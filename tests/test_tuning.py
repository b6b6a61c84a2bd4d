"""fedtree.core.tuning: chunk sizes (balanced, per backend, per device, sized for the model,
aligned with parents) and the autotuner timing real rounds."""

import jax
import numpy as np
import pytest
from perf_problems import make_fedavg, tiny_data

from fedtree.core import tuning
from fedtree.core.sampling import cohort_sampler


def test_balanced_chunks():
  assert tuning.balanced_chunk(1000, 64) == 63            # 16 chunks, 8 padded slots
  assert tuning.balanced_chunk(10, 64) == 10
  assert tuning.balanced_chunk(1000, 64 * 8, 8) % 8 == 0
  assert tuning.default_chunk_size(1000, backend="cpu") == tuning.DEFAULT_CHUNK["cpu"]
  assert tuning.default_chunk_size(3000, backend="gpu") == 3000     # a GPU takes the cohort
  assert tuning.default_chunk_size(40000, backend="gpu") == 13334   # 3 equal chunks
  assert tuning.default_chunk_size(1000, backend="cpu", num_devices=8) % 8 == 0
  assert tuning.candidate_chunks(100) == sorted(set(tuning.candidate_chunks(100)))
  with pytest.raises(ValueError, match="must be >= 1"):
    tuning.balanced_chunk(0, 4)


def test_autotune_picks_fastest_and_times_real_rounds():
  best, timings = tuning.autotune_chunk_size(lambda c: 1.0 / c, [2, 8, 4])
  assert best == 8 and set(timings) == {2, 4, 8}
  data = tiny_data(6, equal=True)
  timer = tuning.round_timer(lambda c: make_fedavg(data, chunk_size=c, steps=1), data,
                             jax.random.key(0))
  best, timings = tuning.autotune_chunk_size(timer, [2, 6], repeats=1)
  assert best in (2, 6) and all(t > 0 for t in timings.values())


def test_sharded_cpu_default_chunk_is_larger_per_device():
  assert tuning.default_chunk_size(1000, backend="cpu", num_devices=2) == 2 * tuning.SHARDED_CPU_CHUNK
  assert tuning.default_chunk_size(1000, backend="cpu", num_devices=1) == tuning.DEFAULT_CHUNK["cpu"]


def test_auto_chunk_is_sized_for_the_model_on_cpu():
  import optax

  from fedtree.models import build_model

  small = build_model("mlp", example_shape=(6,), num_classes=3, hidden=(8,))
  big = build_model("mlp", example_shape=(2048,), num_classes=3, hidden=(2048,))  # 8 MB/step+
  opt = optax.sgd(0.1)
  assert tuning.client_step_bytes(small, opt, (6,), 4) < 2**16
  assert tuning.client_step_bytes(big, opt, (2048,), 4) > tuning.CPU_CHUNK_BUDGET_BYTES // 2
  # a client that fills the cache trains alone on its device; small ones keep the default
  assert tuning.default_chunk_size(100, backend="cpu", num_devices=2,
                                   client_bytes=tuning.CPU_CHUNK_BUDGET_BYTES) == 2
  assert tuning.default_chunk_size(100, backend="cpu", client_bytes=1) == tuning.DEFAULT_CHUNK["cpu"]
  assert tuning.default_chunk_size(100, backend="gpu", client_bytes=1) == 100
  # on a GPU the budget is device memory: 4 GiB of clients of 64 MiB each
  assert tuning.default_chunk_size(1000, backend="gpu", client_bytes=2**26) == 63
  assert tuning.default_chunk_size(100, backend="gpu", client_bytes=2**40) == 1
  policy = tuning.chunk_policy(small, opt, (6,), 4)
  assert policy(1000, 1) == tuning.default_chunk_size(1000, num_devices=1, client_bytes=1)
  parent = np.zeros(10, np.int64)
  assert cohort_sampler(parent, 10, chunk_size=lambda slots, devices, groups: slots // 5).chunk_size == 2


def test_context_resolves_auto_with_the_model_policy():
  import ml_collections

  from fedtree import experiment
  from fedtree.experiment import builders

  cfg = ml_collections.ConfigDict({"chunk_size": "auto"})
  ctx = experiment.Context(config=cfg, data=None, groups=None, topology=None, model=None,
                           local_optimizer=None, schedule=None,
                           auto_chunk=lambda slots, devices, groups=None: 3)
  assert ctx.chunk_size()(10, 1) == 3
  assert ctx.chunk_size(ml_collections.ConfigDict({"chunk_size": 5})) == 5
  assert ctx.chunk_size(ml_collections.ConfigDict({"chunk_size": None})) is None
  kw = builders.resolve_chunk_size({"chunk_size": ctx.chunk_size()}, 10, None, ctx)
  assert cohort_sampler(np.zeros(10, np.int64), 10, chunk_size=kw["chunk_size"]).chunk_size == 3


def test_auto_chunk_prefers_chunks_aligned_with_parents():
  # 10 parents x 100 clients on 2 devices: 64 would straddle parents; 50 divides every cohort
  assert tuning.default_chunk_size(1000, backend="cpu", num_devices=2) == 64
  assert tuning.default_chunk_size(1000, backend="cpu", num_devices=2, group_sizes=[100] * 10) == 50
  assert tuning.default_chunk_size(1000, backend="cpu", num_devices=2, group_sizes=[1000]) == 50
  # nothing aligned within a factor 2: the balanced chunk
  assert tuning.default_chunk_size(1000, backend="cpu", num_devices=2, group_sizes=[97, 903]) == 64
  parent = np.repeat(np.arange(3), 4)
  assert cohort_sampler(parent, None, chunk_size=2).parent_aligned
  assert not cohort_sampler(parent, None, chunk_size=3).parent_aligned
  assert cohort_sampler(np.zeros(7, np.int64), None, chunk_size=3).parent_aligned  # one parent


def test_backend_defaults_for_convolutions():
  from fedtree.models.classifiers import auto_conv_impl

  # im2col matmuls on CPU (jax-ml/jax#12868) and GPU (grouped cuDNN convs under vmap were
  # slower on an H100, benchmarks/README.md); lax.conv on TPU and unknown backends
  assert [auto_conv_impl(b) for b in ("cpu", "gpu", "cuda", "tpu", "other")] == [
    "matmul", "matmul", "matmul", "xla", "xla"]
