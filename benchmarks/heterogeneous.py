r"""What computing on masks costs (issue 51): HeteroFL's tier of five widths as fedtree trains it (every
client a masked slice of one stacked pytree, one compiled step) against the way every peer trains it
(each sampled client's sub-model cut out as a small network of its own and trained one client at a
time), at equal results.

  python -m benchmarks.heterogeneous                  # workload (a): 100 clients, all sampled
  python -m benchmarks.heterogeneous --clients=20 --rounds=2 --repeats=1   # a check that it runs

Both sides run the same rounds of workload (a) (the 60-200-200-10 MLP, 64 examples per client, 4 local
steps of batch 16), the clients at rates 1, 1/2, 1/4, 1/8, 1/16 (a fifth each), no scaler, the same
cohorts and minibatches. The per-client loop is a generous peer: every width's local training is one
jitted ``lax.scan`` over the sliced MLP (compiled once per width, before timing), so it pays only a call
per client and the cutting and averaging in numpy. Printed: seconds per round of each (the median of
``--repeats`` interleaved turns, after a warm-up round), their ratio, and the largest difference of the
two global models after the timed rounds (float32; they are the same computation in another order).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import workloads
from benchmarks.jax_runners import federated_data, jax_model
from fedtree.algorithms import heterofl
from fedtree.algorithms.heterogeneous.width import client_levels
from fedtree.core.local import ClientData, LocalSchedule, batch_at
from fedtree.core.rng import stream
from fedtree.core.sampling import cohort_sampler
from fedtree.models import build_model, masked_cross_entropy

RATES = (1.0, 0.5, 0.25, 0.125, 0.0625)


@functools.cache
def _sub_training(example_shape: tuple, widths: tuple, steps: int, batch_size: int, lr: float):
  """The jitted local training of the sliced MLP of ``widths``: ``steps`` SGD steps."""
  small = build_model("mlp", example_shape=example_shape, num_classes=10, hidden=widths)
  grad = jax.grad(lambda p, b: masked_cross_entropy(small.apply(p, b.x), b.y, b.mask))

  @jax.jit
  def train(params, x, y, n, key):
    batch_key, _ = jax.random.split(key)
    data = ClientData(x=x, y=y, n=n, shuffle=True)

    def step(p, t):
      g = grad(p, batch_at(batch_key, data, t, batch_size))
      return jax.tree.map(lambda a, b: a - lr * b, p, g), None

    return jax.lax.scan(step, params, jnp.arange(steps))[0]

  return train


def loop_round(x: dict, data, levels, sampler, w: workloads.Workload, rk) -> dict:
  """One round as a peer runs it: every sampled client's prefix slices cut out, trained as a small MLP,
  and averaged per coordinate over the clients holding it (by examples; all equal here)."""
  names = sorted(x)
  total = {n: {f: np.zeros_like(v) for f, v in x[n].items()} for n in names}
  held = {n: {f: np.zeros_like(v) for f, v in x[n].items()} for n in names}
  cohort = sampler(stream(rk, "cohort"))
  for c in np.asarray(cohort.clients)[np.asarray(cohort.valid)]:
    rate = RATES[levels[c]]
    widths = tuple(int(np.ceil(rate * x[n]["bias"].size)) for n in names[:-1])
    cut = [slice(None)] + [slice(0, k) for k in widths] + [slice(None)]
    sub = {n: {"kernel": x[n]["kernel"][cut[i], cut[i + 1]], "bias": x[n]["bias"][cut[i + 1]]}
           for i, n in enumerate(names)}
    train = _sub_training(w.example_shape, widths, w.local_steps, w.batch_size, w.lr)
    key = jax.random.fold_in(stream(rk, "train"), int(c))
    new = train(sub, data.x_train[c], data.y_train[c], data.n_train[c], key)
    for i, n in enumerate(names):
      total[n]["kernel"][cut[i], cut[i + 1]] += np.asarray(new[n]["kernel"])
      held[n]["kernel"][cut[i], cut[i + 1]] += 1
      total[n]["bias"][cut[i + 1]] += np.asarray(new[n]["bias"])
      held[n]["bias"][cut[i + 1]] += 1
  return {n: {f: np.where(held[n][f] > 0, total[n][f] / np.maximum(held[n][f], 1), x[n][f]) for f in x[n]}
          for n in names}


def measure(clients: int, rounds: int, repeats: int) -> dict:
  """Seconds per round of the masked tier and of the per-client loop, interleaved, and their gap."""
  w = workloads.mlp(clients)
  data = federated_data(w)
  host_data = jax.tree.map(np.asarray, data)
  alg = heterofl(model=jax_model(w), data=data, local_optimizer=optax.sgd(w.lr), rates=RATES, scaler=False,
                 schedule=LocalSchedule(batch_size=w.batch_size, steps=w.local_steps), weighting="uniform",
                 cohort_size=w.cohort_size, chunk_size=None)
  levels = client_levels(np.full(len(RATES), 1 / len(RATES)), clients, 0)
  sampler = cohort_sampler(np.zeros(clients, np.int32), w.cohort_size)
  key = jax.random.key(w.seed)
  step = jax.jit(alg.round)   # one round a call, round r's key fold_in(key, r), as the loop's
  state = alg.init(key)
  x = jax.tree.map(lambda p: np.asarray(p[0]), state.params[0])
  state, m = step(state, data, jax.random.fold_in(key, 0))   # warm-up: compiles both sides
  jax.block_until_ready((state, m))
  x = loop_round(x, host_data, levels, sampler, w, jax.random.fold_in(key, 0))
  masked, looped = [], []
  for turn in range(repeats):
    t = time.perf_counter()
    for r in range(rounds):
      state, m = step(state, data, jax.random.fold_in(key, 1 + turn * rounds + r))
    jax.block_until_ready((state, m))
    masked.append((time.perf_counter() - t) / rounds)
    t = time.perf_counter()
    for r in range(rounds):
      x = loop_round(x, host_data, levels, sampler, w, jax.random.fold_in(key, 1 + turn * rounds + r))
    looped.append((time.perf_counter() - t) / rounds)
  gap = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(
    jax.tree.leaves(jax.tree.map(lambda p: p[0], state.params[0])), jax.tree.leaves(x), strict=True))
  a, b = statistics.median(masked), statistics.median(looped)
  return dict(clients=clients, cohort=w.cohort_size, rounds=rounds, repeats=repeats, masked_s=a, loop_s=b,
              ratio=b / a, max_abs_diff=gap)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=100)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args(argv)
  out = measure(args.clients, args.rounds, args.repeats)
  print(f"workload (a), {out['clients']} clients, cohort {out['cohort']}, widths {RATES}")
  print(f"masked tier (fedtree)      {out['masked_s']:.4f} s/round")
  print(f"sliced per-client loop     {out['loop_s']:.4f} s/round   ({out['ratio']:.1f}x the masked tier)")
  print(f"largest difference of the two global models: {out['max_abs_diff']:.2e}")
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
