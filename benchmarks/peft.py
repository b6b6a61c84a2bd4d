r"""Memory and throughput of federated LoRA fine-tuning against full fine-tuning, with a
persistent personal model per client (issue 26's benchmark).

  python -m benchmarks.peft                             # 13.41 M-parameter base, N = 100, 1,000, 10,000
  python -m benchmarks.peft --quick                     # a tiny base, N = 4, 8 (a smoke run)

Workload: a causal Transformer LM base (``--vocab``, ``--dim``, ``--depth``, ``--mlp_dim``; the
default has 13.41 M parameters), Ditto (lambda = 0.1) over ``N`` clients, every client in every
round, each holding ``--sentences`` sentences of ``--seq_len`` random tokens, ``--steps`` local
SGD steps of batch ``--batch_size`` (Ditto trains the model sent up and the personal model:
two local trainings per client update), ``--chunk_size`` clients at once.

* ``lora``: :func:`fedtree.toolbox.lora.frozen_base` of Ditto on the adapted model (rank
  ``--rank`` on every kernel, ``--forward`` factored or merged): the base is one copy in the
  state; the global model, the per-client personal models ``[N, ...]`` and everything stacked
  are adapters.
* ``full``: Ditto on the model itself: the personal models are ``N`` full copies.

For every (mode, N), without allocating anything:

* ``state_bytes``: the state, :func:`jax.eval_shape` of ``init``;
* ``peak_bytes``: the compiled round's ``memory_analysis()`` (arguments + temporaries +
  outputs - aliased outputs): what one round needs on the device, the state included.

Where it fits ``--run_limit_gb`` and ``N <= --run_max_clients``, the round also runs:
``client_updates_per_s`` = N x rounds / the best of ``--repeats`` calls of ``--rounds`` fused
rounds after a first call that is not timed; above ``--cold_above`` clients (a round of 10,000
takes many minutes on a CPU) one call is timed, the first (the program is compiled ahead of
time, so compilation is never in a timing). The largest ``N`` that fits in
``--budget_gb`` (24 GB) is ``peak(N) = fixed + per_client x N`` fitted on the two largest
measured N, solved for N. ``closure``: the HLO text size and compile time of one LoRA round with
the base closed over by the model (embedded as constants by JAX 0.10) against the base passed
in the state (:func:`fedtree.toolbox.lora.frozen_base`).

Rows that are not run only compile: with ``XLA_FLAGS="--xla_backend_optimization_level=0
--xla_llvm_disable_expensive_passes=true"`` that is much faster and the memory analysis is
unchanged (LLVM code generation comes after buffer assignment); how the figures in
``benchmarks/README.md`` were obtained is written there. Writes ``benchmarks/results/peft.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedtree.algorithms.personalized.ditto import ditto
from fedtree.core.data import FederatedData
from fedtree.core.local import LocalSchedule
from fedtree.core.loop import make_multi_round
from fedtree.experiment.memory import tree_bytes
from fedtree.models import build_model
from fedtree.toolbox import lora

RESULTS = os.path.join(os.path.dirname(__file__), "results")
GB = 1e9


def make_data(clients: int, sentences: int, seq_len: int, vocab: int, seed: int = 0) -> FederatedData:
  rng = np.random.default_rng(seed)
  w = rng.integers(4, vocab, (clients, sentences, seq_len + 1)).astype(np.int32)
  x, y = jnp.asarray(w[..., :-1]), jnp.asarray(w[..., 1:])
  n = jnp.full((clients,), sentences, jnp.int32)
  return FederatedData(x_train=x, y_train=y, n_train=n, x_test=x[:, :1], y_test=y[:, :1],
                       n_test=jnp.ones((clients,), jnp.int32), num_classes=vocab)


def shapes(tree):
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def build(a, mode: str, data: FederatedData, model, base):
  schedule = LocalSchedule(batch_size=a.batch_size, steps=a.steps)

  def make(m):
    return ditto(model=m, data=data, local_optimizer=optax.sgd(a.lr), schedule=schedule, lam=0.1,
                 chunk_size=a.chunk_size, init_params=None)

  if mode == "full":
    return ditto(model=model, data=data, local_optimizer=optax.sgd(a.lr), schedule=schedule, lam=0.1,
                 chunk_size=a.chunk_size, init_params=base)
  spec = lora.lora(rank=a.rank, alpha=2.0 * a.rank, forward=a.forward)
  return lora.frozen_base(make, model=model, spec=spec, base=base)


def compiled_memory(alg, state_shapes, data, rounds: int):
  fn = jax.jit(make_multi_round(alg, rounds, check_state=False), donate_argnums=(0,))
  t = time.perf_counter()
  compiled = fn.lower(state_shapes, shapes(data), jax.random.key(0)).compile()
  ma = compiled.memory_analysis()
  peak = ma.argument_size_in_bytes + ma.temp_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
  sizes = dict(argument=int(ma.argument_size_in_bytes), temp=int(ma.temp_size_in_bytes),
               output=int(ma.output_size_in_bytes), alias=int(ma.alias_size_in_bytes),
               compile_s=time.perf_counter() - t)
  return fn, compiled, int(peak), sizes


def closure_cost(a, model, base) -> dict:
  """HLO size and compile time of a LoRA round with the base closed over vs in the state."""
  data = make_data(a.chunk_size, a.sentences, a.seq_len, a.vocab)
  schedule = LocalSchedule(batch_size=a.batch_size, steps=a.steps)
  spec = lora.lora(rank=a.rank, alpha=2.0 * a.rank, forward=a.forward)
  out = {}
  closed = ditto(model=lora.adapted_model(model, spec, base), data=data, local_optimizer=optax.sgd(a.lr),
                 schedule=schedule, lam=0.1, chunk_size=a.chunk_size)
  passed = build(a, "lora", data, model, base)
  for name, alg in (("closed_over", closed), ("in_state", passed)):
    state = jax.eval_shape(alg.init, jax.random.key(0))
    t = time.perf_counter()
    fn = jax.jit(make_multi_round(alg, 1, check_state=False))
    lowered = fn.lower(state, shapes(data), jax.random.key(0))
    text = lowered.as_text()
    lowered.compile()
    out[name] = dict(hlo_mb=len(text) / 1e6, lower_and_compile_s=time.perf_counter() - t)
  return out


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true")
  p.add_argument("--clients", default="100,1000,10000")
  p.add_argument("--modes", default="lora,full")
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--dim", type=int, default=384)
  p.add_argument("--depth", type=int, default=4)
  p.add_argument("--heads", type=int, default=6)
  p.add_argument("--mlp_dim", type=int, default=1536)
  p.add_argument("--seq_len", type=int, default=32)
  p.add_argument("--sentences", type=int, default=8)
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--steps", type=int, default=1)
  p.add_argument("--rank", type=int, default=8)
  p.add_argument("--forward", default="factored", choices=lora.FORWARDS)
  p.add_argument("--lr", type=float, default=0.1)
  p.add_argument("--chunk_size", type=int, default=16)
  p.add_argument("--rounds", type=int, default=1)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--run_max_clients", type=int, default=10000)
  p.add_argument("--cold_above", type=int, default=1000)
  p.add_argument("--run_limit_gb", type=float, default=20.0)
  p.add_argument("--budget_gb", type=float, default=24.0)
  p.add_argument("--no_closure", action="store_true")
  p.add_argument("--out", default=os.path.join(RESULTS, "peft.json"))
  a = p.parse_args(argv)
  if a.quick:
    a.clients, a.vocab, a.dim, a.depth, a.heads, a.mlp_dim = "4,8", 64, 16, 1, 2, 32
    a.seq_len, a.sentences, a.chunk_size, a.run_max_clients = 8, 4, 4, 8
  clients = [int(c) for c in a.clients.split(",")]
  model = build_model("transformer_lm", example_shape=(a.seq_len,), num_classes=a.vocab, dim=a.dim,
                      depth=a.depth, heads=a.heads, mlp_dim=a.mlp_dim)
  base = model.init(jax.random.key(0))
  base_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(base))
  adapters = lora.init_adapters(lora.lora(rank=a.rank), base, jax.random.key(1))
  res: dict = dict(args=vars(a), backend=jax.default_backend(), base_params=base_params,
                   adapter_params=lora.adapter_count(adapters), rows=[])
  share = 100 * res["adapter_params"] / base_params
  print(f"base {base_params / 1e6:.2f} M parameters, rank-{a.rank} adapters "
        f"{res['adapter_params'] / 1e6:.3f} M ({share:.2f}%); backend {res['backend']}", flush=True)
  for mode in a.modes.split(","):
    for n in clients:
      data = make_data(n, a.sentences, a.seq_len, a.vocab)
      alg = build(a, mode, data, model, base)
      state_shapes = jax.eval_shape(alg.init, jax.random.key(0))
      row = dict(mode=mode, clients=n, state_bytes=tree_bytes(state_shapes))
      fn, compiled, row["peak_bytes"], row["memory"] = compiled_memory(alg, state_shapes, data, a.rounds)
      if n <= a.run_max_clients and row["peak_bytes"] <= a.run_limit_gb * GB:
        state = alg.init(jax.random.key(0))
        cold = n > a.cold_above
        if not cold:
          state, m = compiled(state, data, jax.random.key(1))     # the first call, not timed
          jax.block_until_ready(m)
        best = float("inf")
        for r in range(1 if cold else a.repeats):
          t = time.perf_counter()
          state, m = compiled(state, data, jax.random.key(2 + r))
          jax.block_until_ready(m)
          best = min(best, time.perf_counter() - t)
        row["round_s"] = best / a.rounds
        row["timed_calls"], row["first_call_timed"] = (1 if cold else a.repeats), cold
        row["client_updates_per_s"] = n * a.rounds / best
        row["train_loss"] = float(np.asarray(m["train_loss"])[-1])
        del state
      res["rows"].append(row)
      rate = (f"{row['client_updates_per_s']:.2f} client updates/s" if "client_updates_per_s" in row
              else "not run")
      print(f"{mode:4s} N={n:6d}: state {row['state_bytes'] / GB:8.3f} GB, round peak "
            f"{row['peak_bytes'] / GB:8.3f} GB (compiled in {row['memory']['compile_s']:.0f} s), {rate}",
            flush=True)
  res["fits"] = {}
  for mode in a.modes.split(","):
    rows = sorted((r for r in res["rows"] if r["mode"] == mode), key=lambda r: r["clients"])
    if len(rows) < 2:
      continue
    (n0, p0), (n1, p1) = [(r["clients"], r["peak_bytes"]) for r in rows[-2:]]
    per_client = (p1 - p0) / (n1 - n0)
    fixed = p1 - per_client * n1
    fit = int((a.budget_gb * GB - fixed) // per_client) if per_client > 0 else None
    res["fits"][mode] = dict(per_client_bytes=per_client, fixed_bytes=fixed, max_clients=fit)
    print(f"{mode:4s}: {per_client / 1e6:.3f} MB per client + {fixed / GB:.3f} GB fixed: at most {fit} "
          f"clients in {a.budget_gb:g} GB", flush=True)
  if not a.no_closure:
    res["closure"] = closure_cost(a, model, base)
    for k, v in res["closure"].items():
      print(f"LoRA round, base {k:11s}: HLO {v['hlo_mb']:.2f} MB, lowered and compiled in "
            f"{v['lower_and_compile_s']:.1f} s", flush=True)
  os.makedirs(os.path.dirname(a.out), exist_ok=True)
  with open(a.out, "w") as f:
    json.dump(res, f, indent=2)
  return res


if __name__ == "__main__":
  main()
