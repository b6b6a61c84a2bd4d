r"""Memory of client data: padded ``[C, M, ...]`` vs ragged (flat + offsets) storage.

  python -m benchmarks.ragged

(a) PerMFL's Synthetic(0.5, 0.5) (50 clients, ``samples_scale=5``, no cap; 60 float features):
built for real, the padded arrays' bytes against :func:`fedtree.core.ragged.from_padded`'s.
(b) A StackOverflow-like population: 100,000 clients with lognormal sentence counts
(``exp N(3.5, 1.5)``, at least 1; TFF's StackOverflow has a similar long tail) of
``T = 20`` tokens (``x`` and ``y`` int32): the bytes of both layouts from the array sizes
(:func:`fedtree.core.ragged.padded_bytes` / ``ragged_bytes``; the padded arrays would not fit
in memory). Prints a table and writes ``benchmarks/results/ragged.json``.
(c) Training on (b)'s population for real (``--train``): the same 100,000 lognormal client
sizes holding 8-float examples (a linear teacher's labels), stored ragged
(:attr:`fedtree.core.data.FederatedData.train_offset`); FedAvg with logistic regression, 1,000
clients per round, 10 local steps of 16. Padded, these arrays would take ``100,000 x largest
client`` rows; ragged they take the examples alone. Reports the data's bytes both ways, the
process's peak RSS, compile time and client-updates/s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np

from fedtree.core import ragged
from fedtree.datasets.synthetic import synthetic_alpha_beta

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def permfl_synthetic() -> dict:
  data = synthetic_alpha_beta(num_clients=50, alpha=0.5, beta=0.5, dim=60, num_classes=10,
                              samples_scale=5, test_fraction=0.25, seed=0)
  n = np.asarray(data.n_train)
  padded = sum(np.asarray(a).nbytes for a in (data.x_train, data.y_train, data.n_train))
  flat = ragged.from_padded(data).nbytes
  return dict(name="PerMFL Synthetic(0.5,0.5) train", clients=len(n), min=int(n.min()), max=int(n.max()),
              examples=int(n.sum()), padded_bytes=int(padded), ragged_bytes=int(flat))


def stackoverflow_like(num_clients: int = 100_000, seq_len: int = 20, seed: int = 0) -> dict:
  counts = np.maximum(np.random.default_rng(seed).lognormal(3.5, 1.5, num_clients).astype(np.int64), 1)
  example = 2 * 4 * seq_len
  return dict(name=f"lognormal sentences x {seq_len} tokens", clients=num_clients, min=int(counts.min()),
              max=int(counts.max()), examples=int(counts.sum()),
              padded_bytes=ragged.padded_bytes(counts, example),
              ragged_bytes=ragged.ragged_bytes(counts, example))


def train_stackoverflow_like(num_clients: int = 100_000, dim: int = 8, cohort: int = 1000,
                             rounds: int = 5, seed: int = 0) -> dict:
  """(c): FedAvg rounds on the lognormal population stored ragged (see the module docstring)."""
  import jax
  import optax

  from fedtree.algorithms import fedavg
  from fedtree.core import loop
  from fedtree.core.data import FederatedData, as_device
  from fedtree.core.local import LocalSchedule
  from fedtree.models import build_model

  rng = np.random.default_rng(seed)
  counts = np.maximum(rng.lognormal(3.5, 1.5, num_clients).astype(np.int64), 1).astype(np.int32)
  total = int(counts.sum())
  teacher = rng.normal(size=(dim, 4)).astype(np.float32)
  x = rng.normal(size=(total, dim)).astype(np.float32)
  y = np.argmax(x @ teacher, axis=1).astype(np.int32)
  xt = rng.normal(size=(num_clients, 1, dim)).astype(np.float32)
  data = FederatedData(
    x_train=x, y_train=y, n_train=counts, x_test=xt, y_test=np.argmax(xt @ teacher, -1).astype(np.int32),
    n_test=np.ones(num_clients, np.int32), num_classes=4,
    train_offset=np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32),
    ragged_max_train=int(counts.max()),
  ).validate()
  data = as_device(data)
  model = build_model("logreg", example_shape=(dim,), num_classes=4)
  alg = fedavg(model=model, data=data, local_optimizer=optax.sgd(0.1),
               schedule=LocalSchedule(batch_size=16, steps=10), cohort_size=cohort)
  t0 = time.perf_counter()
  state = loop.run(alg, data, num_rounds=1, key=jax.random.key(0))
  jax.block_until_ready(state.params)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  state = loop.run(alg, data, num_rounds=1 + rounds, key=jax.random.key(0), state=state)
  jax.block_until_ready(state.params)
  steady = (time.perf_counter() - t0) / rounds
  example = dim * 4 + 4
  return dict(name=f"FedAvg on {num_clients:,} lognormal clients, ragged", clients=num_clients,
              min=int(counts.min()), max=int(counts.max()), examples=total,
              padded_bytes=ragged.padded_bytes(counts, example),
              ragged_bytes=ragged.ragged_bytes(counts, example),
              first_round_s=first, round_s=steady, client_updates_per_s=cohort / steady,
              peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--train", action="store_true", help="(c): train FedAvg on the ragged population")
  args = p.parse_args(argv)
  rows = [permfl_synthetic(), stackoverflow_like()]
  if args.train:
    rows.append(train_stackoverflow_like())
  print(f"{'data':40s} {'clients':>8s} {'sizes':>14s} {'examples':>11s} {'padded MB':>11s} "
        f"{'ragged MB':>10s} {'ratio':>7s}")
  for r in rows:
    r["ratio"] = r["padded_bytes"] / r["ragged_bytes"]
    print(f"{r['name']:40s} {r['clients']:8d} {r['min']:>6d}..{r['max']:<6d} {r['examples']:11d} "
          f"{r['padded_bytes'] / 1e6:11.1f} {r['ragged_bytes'] / 1e6:10.1f} {r['ratio']:6.1f}x")
  for r in rows:
    if "round_s" in r:
      print(f"{r['name']}: first round (compile) {r['first_round_s']:.1f} s, then {r['round_s']:.3f} s "
            f"per round ({r['client_updates_per_s']:,.0f} client-updates/s), "
            f"peak RSS {r['peak_rss_mb']:,.0f} MB")
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, "ragged.json"), "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
