r"""How far a benchmark is from the hardware: the device's peaks, measured on the device itself, and a
workload's achieved FLOP/s and bytes/s as fractions of them.

  python -m benchmarks.hardware            # this device's peaks (about 10 s)

**Peaks.** ``gemm``: the best FLOP/s of a jitted float32 matrix product (``n x n`` by ``n x n``,
``2 n³`` FLOPs, the largest of a few sizes); ``copy``: the best bytes/s of a jitted ``y = a x`` over a
256 MiB float32 array (one read and one write of every byte; XLA cannot elide it: main memory's
bandwidth), and ``cache copy`` the best of the same over 1 to 16 MiB (what the caches give: a small
model's step mostly hits them, so its bytes/s can pass main memory's). Both on this
device, timed as the benchmarks are (compiled first, best of several calls), so a fraction is of what
this machine reaches, whatever its load when measured (the JSON records the load). On a GPU the
same programs run (a float32 product at the backend's default precision: TF32 tensor cores on an
H100, the rate the workloads' own float32 products get); the datasheet figures of the devices named
in :data:`DATASHEETS` are listed beside them (dense float32 / bfloat16 tensor-core FLOP/s and memory
bandwidth), never used in place of the measured ones.

**A workload's figures.** XLA's cost analysis of a compiled program counts a loop's body once,
whatever its trip count (a ``lax.scan`` of 10 products reports one), so the fused round's own count
is not the work it does. The FLOPs and bytes are those of one compiled client step (the model's
gradient and the optimizer's update on one batch: no loop, :func:`client_step_cost`), times the
steps a round takes (``cohort x local_steps``): the work every simulator must do for the round, which
is what a fraction of the peak should measure; the bytes are the step's own traffic as XLA counts it
(parameters, activations, gradients), the floor the issue-41 profile compares the passes against.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp

DATASHEETS: dict[str, dict[str, float]] = {
  "NVIDIA H100 80GB HBM3": dict(fp32_flops=67e12, bf16_flops=989e12, bytes_per_s=3.35e12),
  "NVIDIA H200": dict(fp32_flops=67e12, bf16_flops=989e12, bytes_per_s=4.8e12),
  "NVIDIA A100-SXM4-80GB": dict(fp32_flops=19.5e12, bf16_flops=312e12, bytes_per_s=2.04e12),
}
"""Datasheet peaks (dense, no sparsity) of the accelerators the benchmarks have run on, by
``device_kind``: named beside the measured peaks, never in their place."""


def _best(fn, *args, calls: int) -> float:
  """The best wall time of ``calls`` calls of the compiled ``fn`` (after one warm-up call)."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(calls):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t)
  return best


def peaks(*, sizes=(512, 1024, 2048), copy_mib: int = 256, cache_mib=(1, 4, 16),
          calls: int = 5) -> dict[str, Any]:
  """This device's measured peaks: ``flops_per_s`` (float32 GEMM, the best of ``sizes``),
  ``bytes_per_s`` (a scaled copy of ``copy_mib`` MiB, read and write) and ``cache_bytes_per_s`` (the
  best copy of ``cache_mib`` MiB), with the device's kind, its datasheet figures where
  :data:`DATASHEETS` has them, and the load average when measured."""
  gemm = jax.jit(lambda a, b: a @ b)
  flops = 0.0
  for n in sizes:
    a = jnp.ones((n, n), jnp.float32)
    flops = max(flops, 2.0 * n ** 3 / _best(gemm, a, a, calls=calls))
  scale = jax.jit(lambda x: x * jnp.float32(1.000001))

  def copy(mib):
    x = jnp.ones((int(mib * 2 ** 20) // 4,), jnp.float32)
    return 2.0 * x.nbytes / _best(scale, x, calls=calls)

  bandwidth = copy(copy_mib)
  cached = max([bandwidth] + [copy(m) for m in cache_mib])
  kind = jax.devices()[0].device_kind
  try:
    load = list(os.getloadavg())
  except OSError:
    load = None
  return dict(device=kind, backend=jax.default_backend(), flops_per_s=flops, bytes_per_s=bandwidth,
              cache_bytes_per_s=cached, datasheet=DATASHEETS.get(kind), load_average=load)


def client_step_cost(model, optimizer, example_shape, batch_size: int) -> dict[str, float]:
  """``{"flops", "bytes"}`` of one compiled client step (the model's gradient and ``optimizer``'s
  update on a batch of ``batch_size``), from XLA's cost analysis of that loop-free program."""
  from fedtree.core.local import Batch, SGDCarry, make_sgd_step

  params = jax.eval_shape(model.init, jax.random.key(0))
  carry = jax.eval_shape(lambda p: SGDCarry(params=p, opt_state=optimizer.init(p), anchor=p), params)
  batch = Batch(x=jax.ShapeDtypeStruct((batch_size,) + tuple(example_shape),
                                       getattr(model, "input_dtype", "float32")),
                y=jax.ShapeDtypeStruct((batch_size,) + tuple(getattr(model, "label_shape", ())), jnp.int32),
                mask=jax.ShapeDtypeStruct((batch_size,), jnp.bool_))
  key = jax.eval_shape(lambda: jax.random.key(0))
  cost = jax.jit(make_sgd_step(model, optimizer)).lower(carry, batch, key).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return dict(flops=float(cost.get("flops", 0.0)), bytes=float(cost.get("bytes accessed", 0.0)))


def fractions(step: dict[str, float], steps_per_round: int, seconds_per_round: float,
              peak: dict[str, Any]) -> dict[str, float]:
  """A round's achieved ``flops_per_s`` and ``bytes_per_s`` (``steps_per_round`` client steps of cost
  ``step`` in ``seconds_per_round``) and their fractions of ``peak`` (:func:`peaks`): of the GEMM's
  FLOP/s, of the in-cache copy's bytes/s (``bytes_fraction``) and of main memory's
  (``dram_fraction``, above 1 where the step runs from the caches)."""
  flops = step["flops"] * steps_per_round / seconds_per_round
  moved = step["bytes"] * steps_per_round / seconds_per_round
  return dict(flops_per_s=flops, bytes_per_s=moved, flops_fraction=flops / peak["flops_per_s"],
              bytes_fraction=moved / peak["cache_bytes_per_s"], dram_fraction=moved / peak["bytes_per_s"])


def describe(peak: dict[str, Any]) -> str:
  """One line naming the peaks (and the datasheet's, where known)."""
  line = (f"{peak['device']} ({peak['backend']}): measured {peak['flops_per_s'] / 1e9:.1f} GFLOP/s "
          f"float32 GEMM, {peak['cache_bytes_per_s'] / 1e9:.1f} GB/s in-cache copy, "
          f"{peak['bytes_per_s'] / 1e9:.1f} GB/s main-memory copy")
  sheet = peak.get("datasheet")
  if sheet:
    line += (f"; datasheet {sheet['fp32_flops'] / 1e12:.1f} TFLOP/s float32, "
             f"{sheet['bf16_flops'] / 1e12:.0f} TFLOP/s bfloat16, {sheet['bytes_per_s'] / 1e12:.2f} TB/s")
  return line


def main(argv=None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--json", action="store_true", help="print the peaks as JSON")
  args = p.parse_args(argv)
  peak = peaks()
  print(json.dumps(peak, indent=1) if args.json else describe(peak))
  return peak


if __name__ == "__main__":
  main()
