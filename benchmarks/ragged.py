r"""Memory of client data: padded ``[C, M, ...]`` vs ragged (flat + offsets) storage.

  python -m benchmarks.ragged

(a) PerMFL's Synthetic(0.5, 0.5) (50 clients, ``samples_scale=5``, no cap; 60 float features):
built for real, the padded arrays' bytes against :func:`fedtree.core.ragged.from_padded`'s.
(b) A StackOverflow-like population: 100,000 clients with lognormal sentence counts
(``exp N(3.5, 1.5)``, at least 1; TFF's StackOverflow has a similar long tail) of
``T = 20`` tokens (``x`` and ``y`` int32): the bytes of both layouts from the array sizes
(:func:`fedtree.core.ragged.padded_bytes` / ``ragged_bytes``; the padded arrays would not fit
in memory). Prints a table and writes ``benchmarks/results/ragged.json``.
"""

from __future__ import annotations

import json
import os

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


def main() -> None:
  rows = [permfl_synthetic(), stackoverflow_like()]
  print(f"{'data':40s} {'clients':>8s} {'sizes':>14s} {'examples':>11s} {'padded MB':>11s} "
        f"{'ragged MB':>10s} {'ratio':>7s}")
  for r in rows:
    r["ratio"] = r["padded_bytes"] / r["ragged_bytes"]
    print(f"{r['name']:40s} {r['clients']:8d} {r['min']:>6d}..{r['max']:<6d} {r['examples']:11d} "
          f"{r['padded_bytes'] / 1e6:11.1f} {r['ragged_bytes'] / 1e6:10.1f} {r['ratio']:6.1f}x")
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, "ragged.json"), "w") as f:
    json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
