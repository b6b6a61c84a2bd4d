r"""Throughput of federated language modeling: tokens/s of fedtree's FedAvg with the LSTM LM
against the central JAX bound and a per-client PyTorch loop, same workload, same machine.

  python -m benchmarks.lm              # 32 clients, LSTM 64/128, vocabulary 2,000, T = 20
  python -m benchmarks.lm --quick      # 8 clients (a smoke run)

Workload: ``clients`` clients of ``sentences`` random sentences of ``T`` tokens (ids in
``[4, V)``, no padding, so every framework processes the same number of tokens), every client
in every round, ``steps`` local SGD steps of batch ``B``. Tokens per round = clients x steps x
B x T.

* fedtree: :func:`fedtree.algorithms.optimization.fedavg.fedavg` with ``build_model("lstm_lm")``,
  ``rounds`` rounds fused into one call (:func:`fedtree.core.loop.compile_rounds`), chunk from
  the runner's ``"auto"`` policy; best of ``repeats`` calls.
* central JAX bound: one LSTM trained with ``clients x B`` sentences per step, ``steps`` steps
  per round (no per-client models): what the hardware does without federation.
* PyTorch loop (when ``torch`` imports; skipped otherwise): the usual simulator, one
  ``nn.LSTM`` LM per client trained in turn from the global weights, then averaged.

Prints tokens/s and ratios; writes ``benchmarks/results/lm.json``.
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

from benchmarks.jax_runners import time_fused
from fedtree.algorithms import fedavg
from fedtree.core import sharding, tuning
from fedtree.core.data import FederatedData
from fedtree.core.local import LocalSchedule
from fedtree.core.loop import compile_rounds
from fedtree.core.model import masked_cross_entropy
from fedtree.models import build_model

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def make_tokens(clients: int, sentences: int, seq_len: int, vocab: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  w = rng.integers(4, vocab, (clients, sentences, seq_len + 1)).astype(np.int32)
  return w[..., :-1], w[..., 1:]


def run_fedtree(a, x, y) -> dict:
  model = build_model("lstm_lm", example_shape=(a.seq_len,), num_classes=a.vocab, embed=a.embed,
                      hidden=a.hidden, layers=a.layers)
  c = x.shape[0]
  data = FederatedData(x_train=jnp.asarray(x), y_train=jnp.asarray(y), n_train=jnp.full((c,), x.shape[1]),
                       x_test=jnp.asarray(x[:, :1]), y_test=jnp.asarray(y[:, :1]),
                       n_test=jnp.ones((c,), jnp.int32), num_classes=a.vocab)
  opt = optax.sgd(a.lr)
  chunk = tuning.chunk_policy(model, opt, (a.seq_len,), a.batch_size)(c, sharding.mesh_size())
  alg = fedavg(model=model, data=data, local_optimizer=opt,
               schedule=LocalSchedule(batch_size=a.batch_size, epochs=None, steps=a.steps),
               server_optimizer=optax.sgd(1.0), chunk_size=chunk)
  step = compile_rounds(alg, a.rounds)
  state = alg.init(jax.random.key(0))
  _, first, best, loss = time_fused(step, state, data, jax.random.key(1), a.repeats)
  return dict(seconds_per_round=best / a.rounds, compile_s=first - best, final_loss=loss, chunk_size=chunk)


def run_central(a, x, y) -> dict:
  model = build_model("lstm_lm", example_shape=(a.seq_len,), num_classes=a.vocab, embed=a.embed,
                      hidden=a.hidden, layers=a.layers)
  opt = optax.sgd(a.lr)
  c, b = x.shape[0], a.batch_size
  xs = jnp.asarray(x[:, : a.steps * b]).reshape(c, a.steps, b, -1).swapaxes(0, 1).reshape(a.steps, c * b, -1)
  ys = jnp.asarray(y[:, : a.steps * b]).reshape(c, a.steps, b, -1).swapaxes(0, 1).reshape(a.steps, c * b, -1)
  mask = jnp.ones((c * b,), bool)

  def sgd(carry, batch):
    p, s = carry
    loss, g = jax.value_and_grad(lambda p: masked_cross_entropy(model.apply(p, batch[0]), batch[1], mask))(p)
    u, s = opt.update(g, s, p)
    return (optax.apply_updates(p, u), s), loss

  @jax.jit
  def step(carry, _data, _key):
    def one_round(carry, _):
      carry, losses = jax.lax.scan(sgd, carry, (xs, ys))
      return carry, losses.mean()
    carry, losses = jax.lax.scan(one_round, carry, None, length=a.rounds)
    return carry, {"train_loss": losses}

  p = model.init(jax.random.key(0))
  _, first, best, loss = time_fused(step, (p, opt.init(p)), None, None, a.repeats)
  return dict(seconds_per_round=best / a.rounds, compile_s=first - best, final_loss=loss)


def run_torch(a, x, y) -> dict | None:
  try:
    import torch
  except ImportError:
    return None
  torch.manual_seed(0)
  torch.set_num_threads(max(1, os.cpu_count() or 1))

  class LM(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.embed = torch.nn.Embedding(a.vocab, a.embed)
      self.lstm = torch.nn.LSTM(a.embed, a.hidden, num_layers=a.layers, batch_first=True)
      self.out = torch.nn.Linear(a.hidden, a.vocab)

    def forward(self, t):
      return self.out(self.lstm(self.embed(t))[0])

  glob = LM()
  local = LM()
  xt, yt = torch.from_numpy(x).long(), torch.from_numpy(y).long()
  b = a.batch_size

  def one_round():
    total = {k: torch.zeros_like(v) for k, v in glob.state_dict().items()}
    for c in range(x.shape[0]):
      local.load_state_dict(glob.state_dict())
      opt = torch.optim.SGD(local.parameters(), lr=a.lr)
      for s in range(a.steps):
        xb, yb = xt[c, s * b:(s + 1) * b], yt[c, s * b:(s + 1) * b]
        loss = torch.nn.functional.cross_entropy(local(xb).reshape(-1, a.vocab), yb.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
      for k, v in local.state_dict().items():
        total[k] += v
    glob.load_state_dict({k: v / x.shape[0] for k, v in total.items()})
    return float(loss.detach())

  one_round()
  best = float("inf")
  for _ in range(a.repeats):
    t = time.perf_counter()
    for _ in range(a.rounds):
      loss = one_round()
    best = min(best, time.perf_counter() - t)
  return dict(seconds_per_round=best / a.rounds, final_loss=loss, torch=torch.__version__)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true")
  p.add_argument("--clients", type=int, default=32)
  p.add_argument("--seq_len", type=int, default=20)
  p.add_argument("--vocab", type=int, default=2000)
  p.add_argument("--embed", type=int, default=64)
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--layers", type=int, default=1)
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--steps", type=int, default=4)
  p.add_argument("--lr", type=float, default=0.5)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--no_torch", action="store_true")
  a = p.parse_args(argv)
  if a.quick:
    a.clients, a.rounds, a.repeats = 8, 1, 1
  x, y = make_tokens(a.clients, a.steps * a.batch_size, a.seq_len, a.vocab)
  tokens = a.clients * a.steps * a.batch_size * a.seq_len
  rows = {"fedtree": run_fedtree(a, x, y), "central JAX bound": run_central(a, x, y)}
  torch_row = None if a.no_torch else run_torch(a, x, y)
  if torch_row is None:
    print("PyTorch loop: skipped (torch not importable or --no_torch)")
  else:
    rows["PyTorch per-client loop"] = torch_row
  print(f"LSTM LM {a.embed}/{a.hidden}x{a.layers}, V={a.vocab}, T={a.seq_len}, {a.clients} clients x "
        f"{a.steps} steps x B={a.batch_size}: {tokens} tokens/round; backend {jax.default_backend()}")
  ft = tokens / rows["fedtree"]["seconds_per_round"]
  for name, r in rows.items():
    r["tokens_per_s"] = tokens / r["seconds_per_round"]
    print(f"  {name:26s} {r['tokens_per_s']:12,.0f} tokens/s  fedtree / this = {ft / r['tokens_per_s']:.2f}")
  out = dict(config=vars(a), tokens_per_round=tokens, backend=jax.default_backend(), results=rows)
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, "lm.json"), "w") as f:
    json.dump(out, f, indent=1, default=str)
  return out


if __name__ == "__main__":
  main()
