r"""What asking for a stop between fused rounds costs (issue 59 item 2).

  python -m benchmarks.stop_poll            # tiny and mid-size rounds, 25 and 1,000 rounds a call
  python -m benchmarks.stop_poll --tiny     # a check that the script runs (tests/test_benchmarks.py)

A run given ``should_stop`` (every ``fedtree.main`` run: its SIGINT/SIGTERM flag) compiles calls that
ask it between their rounds (:func:`fedtree.core.loop.make_multi_round`, a host callback every
:func:`~fedtree.core.loop.poll_every` rounds); the library and the throughput benchmarks, which pass
none, run the plain program. This prints the seconds per round of both, measured interleaved in the
same process (the median of ``--repeats``), and their ratio.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np


def _problem(clients: int, hidden: int, dim: int):
  import optax

  from fedtree.algorithms import fedavg
  from fedtree.core.data import as_device
  from fedtree.core.local import LocalSchedule
  from fedtree.datasets.synthetic import grouped_synthetic
  from fedtree.models import build_model

  data, _ = grouped_synthetic(group_sizes=(clients,), dim=dim, num_classes=10, mean_examples=20,
                              min_examples=10, max_examples=40, test_examples=4, seed=0)
  model = build_model("mlp", example_shape=data.example_shape, num_classes=10, hidden=(hidden,))
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(0.05), cohort_size=min(clients, 20),
               schedule=LocalSchedule(batch_size=10, epochs=1))
  return alg, as_device(data)


def per_round(alg, data, *, rounds: int, per_call: int, stoppable: bool) -> float:
  """Seconds a round, over ``rounds`` rounds fused ``per_call`` a call (compiled before timing)."""
  import jax

  from fedtree.core import loop

  stop = (lambda: False) if stoppable else None
  kw = dict(key=jax.random.key(0), rounds_per_call=per_call, should_stop=stop)
  jax.block_until_ready(loop.run(alg, data, num_rounds=per_call, **kw))   # compiles
  start = time.perf_counter()
  jax.block_until_ready(loop.run(alg, data, num_rounds=rounds, **kw))
  return (time.perf_counter() - start) / rounds


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--tiny", action="store_true")
  p.add_argument("--repeats", type=int, default=5)
  a = p.parse_args(argv)
  cases = [("tiny MLP (hidden 16, dim 8)", 20, 16, 8), ("MLP (hidden 512, dim 256)", 200, 512, 256)]
  calls = (25, 1000)
  if a.tiny:
    cases, calls, a.repeats = cases[:1], (5,), 1
  from fedtree.core.loop import poll_every

  rows = []
  for name, clients, hidden, dim in cases:
    alg, data = _problem(clients, hidden, dim)
    for per_call in calls:
      rounds = 2 * per_call
      timed = functools.partial(per_round, alg, data, rounds=rounds, per_call=per_call)
      pairs = [(timed(stoppable=False), timed(stoppable=True)) for _ in range(a.repeats)]
      plain, asked = (float(np.median([x[i] for x in pairs])) for i in (0, 1))
      rows.append(dict(model=name, rounds_per_call=per_call, poll_every=poll_every(per_call),
                       plain_ms=plain * 1e3, stoppable_ms=asked * 1e3, ratio=asked / plain))
  head = (f"{'model':<28} {'rounds/call':>11} {'poll every':>10} {'plain ms':>9} {'stoppable ms':>12} "
          f"{'ratio':>6}")
  print(head)
  print("-" * len(head))
  for r in rows:
    print(f"{r['model']:<28} {r['rounds_per_call']:>11} {r['poll_every']:>10} {r['plain_ms']:>9.3f} "
          f"{r['stoppable_ms']:>12.3f} {r['ratio']:>6.2f}")
  print(json.dumps(rows))
  return rows


if __name__ == "__main__":
  main()
