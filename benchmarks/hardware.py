r"""How far a benchmark is from the hardware: the device's peaks, measured on the device itself, and a
workload's achieved FLOP/s and bytes/s as fractions of them.

  python -m benchmarks.hardware            # this device's peaks (about 10 s)

**Peaks.** ``gemm``: the best FLOP/s of a jitted float32 matrix product (``n x n`` by ``n x n``,
``2 n³`` FLOPs, the largest of a few sizes); ``copy``: the best bytes/s of a jitted ``y = a x`` over a
256 MiB float32 array (one read and one write of every byte; XLA cannot elide it). Both on this
device, timed as the benchmarks are (compiled first, best of several calls), so a fraction is of what
this machine reaches, whatever its load when measured (the JSON records the load). On a GPU the
same programs run; the datasheet figures of the devices named in :data:`DATASHEETS` are listed
beside them (dense float32 / bfloat16 tensor-core FLOP/s and memory bandwidth), never used in place
of the measured ones.

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


def peaks(*, sizes=(512, 1024, 2048), copy_mib: int = 256, calls: int = 5) -> dict[str, Any]:
  """This device's measured peaks: ``flops_per_s`` (float32 GEMM, the best of ``sizes``) and
  ``bytes_per_s`` (a scaled copy of ``copy_mib`` MiB, read and write), with the device's kind, its
  datasheet figures where :data:`DATASHEETS` has them, and the load average when measured."""
  gemm = jax.jit(lambda a, b: a @ b)
  flops = 0.0
  for n in sizes:
    a = jnp.ones((n, n), jnp.float32)
    flops = max(flops, 2.0 * n ** 3 / _best(gemm, a, a, calls=calls))
  scale = jax.jit(lambda x: x * jnp.float32(1.000001))
  x = jnp.ones((copy_mib * 2 ** 20 // 4,), jnp.float32)
  bandwidth = 2.0 * x.nbytes / _best(scale, x, calls=calls)
  kind = jax.devices()[0].device_kind
  try:
    load = list(os.getloadavg())
  except OSError:
    load = None
  return dict(device=kind, backend=jax.default_backend(), flops_per_s=flops, bytes_per_s=bandwidth,
              datasheet=DATASHEETS.get(kind), load_average=load)


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
  ``step`` in ``seconds_per_round``) and their fractions of ``peak`` (:func:`peaks`)."""
  flops = step["flops"] * steps_per_round / seconds_per_round
  moved = step["bytes"] * steps_per_round / seconds_per_round
  return dict(flops_per_s=flops, bytes_per_s=moved, flops_fraction=flops / peak["flops_per_s"],
              bytes_fraction=moved / peak["bytes_per_s"])


def describe(peak: dict[str, Any]) -> str:
  """One line naming the peaks (and the datasheet's, where known)."""
  line = (f"{peak['device']} ({peak['backend']}): measured {peak['flops_per_s'] / 1e9:.1f} GFLOP/s "
          f"float32 GEMM, {peak['bytes_per_s'] / 1e9:.1f} GB/s copy")
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
