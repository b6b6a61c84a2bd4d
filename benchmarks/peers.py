"""The PyTorch peers: a plain per-client loop, and Flower's simulation engine.

The loop is what FLSim/PFLlib-style simulators do each round: for every sampled client,
load the global ``state_dict`` into a local model, run SGD on the client's minibatches, add
its ``state_dict`` weighted by its examples into a running sum; the server then moves the
global model by ``server_lr`` towards the weighted average. Flower runs the same client code
as ``NumPyClient``s under ``flwr.simulation`` (Ray actors) with its ``FedAvg`` strategy.
Both see the arrays of :func:`benchmarks.workloads.make_arrays`.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from benchmarks.workloads import Workload, make_arrays


def torch_model(w: Workload):
  import torch.nn as nn

  if w.model == "mlp":
    d = int(np.prod(w.example_shape))
    return nn.Sequential(nn.Flatten(), nn.Linear(d, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                         nn.Linear(200, w.num_classes))
  h, wd, ch = w.example_shape
  flat = 64 * ((h - 4) // 2) * ((wd - 4) // 2)
  return nn.Sequential(
    nn.Conv2d(ch, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
    nn.Dropout(0.25), nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(0.5),
    nn.Linear(128, w.num_classes),
  )


@functools.lru_cache(maxsize=2)
def torch_arrays(w: Workload):
  """``x [C, M, ...]`` (NCHW images for the CNN) and ``y [C, M]`` as torch tensors."""
  import torch

  x, y = make_arrays(w)
  if w.model == "cnn":
    x = np.ascontiguousarray(np.moveaxis(x, -1, 2))   # [C, M, H, W, ch] -> [C, M, ch, H, W]
  return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def local_train(model, x, y, w: Workload, generator) -> float:
  """``local_steps`` SGD steps on shuffled minibatches of one client (in place); mean loss."""
  import torch
  import torch.nn.functional as F

  opt = torch.optim.SGD(model.parameters(), lr=w.lr)
  n = x.shape[0]
  spe = -(-n // w.batch_size)
  total = torch.zeros(())
  model.train()
  perm = torch.randperm(n, generator=generator)
  for t in range(w.local_steps):
    if t and t % spe == 0:
      perm = torch.randperm(n, generator=generator)
    j = t % spe
    idx = perm[j * w.batch_size:(j + 1) * w.batch_size]
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    total = total.to(loss.device) + loss.detach()   # no host sync per step (GPU)
  return float(total) / max(w.local_steps, 1)


TORCH_THREADS = 1  # intra-op threads of the PyTorch peers (see run_torch_loop)


def torch_device(device: str = "auto") -> str:
  """``"auto"``: ``"cuda"`` when PyTorch sees a GPU, else ``"cpu"``; any other value as given."""
  import torch

  if device == "auto":
    return "cuda" if torch.cuda.is_available() else "cpu"
  return device


def run_torch_loop(w: Workload, *, rounds: int, threads: int = TORCH_THREADS,
                   device: str = "auto") -> dict:
  """Plain per-client PyTorch FedAvg: ``rounds`` timed rounds after one warm-up client.

  ``device``: where the models and the clients' data live (``"auto"``: CUDA when available;
  the data is moved there once, before timing, as a GPU simulator keeps it). The loss is read
  back once per client (as ``loss.item()`` loggers do), not once per step.

  ``threads``: torch intra-op threads. One is the fast and stable choice for these small
  per-client models: on the shared 2-core machine 1 thread gave ~600 client-updates/s on
  (a) and 2 threads between 16 and 600 (OpenMP spinning against other processes).
  """
  import torch

  torch.set_num_threads(int(threads))
  torch.manual_seed(w.seed)
  gen = torch.Generator().manual_seed(w.seed)
  dev = torch_device(device)
  x, y = torch_arrays(w)
  x, y = x.to(dev), y.to(dev)
  global_model, local = torch_model(w).to(dev), torch_model(w).to(dev)
  global_sd = {k: v.detach().clone() for k, v in global_model.state_dict().items()}
  rng = np.random.default_rng(w.seed)
  local.load_state_dict(global_sd)
  local_train(local, x[0], y[0], w, gen)                    # warm-up (allocator, kernels)

  def one_round():
    nonlocal global_sd
    cohort = rng.choice(w.num_clients, size=w.cohort_size, replace=False)
    acc = {k: torch.zeros_like(v) for k, v in global_sd.items()}
    weight, loss = 0.0, 0.0
    for c in cohort:
      local.load_state_dict(global_sd)
      loss += local_train(local, x[c], y[c], w, gen)
      n = float(x.shape[1])
      with torch.no_grad():
        for k, v in local.state_dict().items():
          acc[k].add_(v, alpha=n)
      weight += n
    with torch.no_grad():
      global_sd = {k: g + w.server_lr * (acc[k] / weight - g) for k, g in global_sd.items()}
    return loss / len(cohort)

  sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
  sync()
  t = time.perf_counter()
  for _ in range(rounds):
    loss = one_round()
  sync()
  dt = time.perf_counter() - t
  out = dict(seconds_per_round=dt / rounds, final_loss=loss, rounds_timed=rounds,
             torch_threads=torch.get_num_threads(), torch_device=dev, torch_version=torch.__version__)
  if dev.startswith("cuda"):
    out["torch_gpu"] = torch.cuda.get_device_name()
  return out


# ------------------------------------------------------------------------ Flower
def _flower_client(cid: int, w: Workload):
  """A Flower ``NumPyClient`` training client ``cid`` with :func:`local_train`."""
  import torch
  from flwr.client import NumPyClient

  class Client(NumPyClient):
    def fit(self, parameters, config):
      torch.set_num_threads(TORCH_THREADS)   # one Ray actor per core
      x, y = torch_arrays(w)
      model = torch_model(w)
      keys = list(model.state_dict().keys())
      model.load_state_dict({k: torch.from_numpy(np.asarray(p)) for k, p in zip(keys, parameters,
                                                                                 strict=True)})
      loss = local_train(model, x[cid], y[cid], w, torch.Generator().manual_seed(cid))
      out = [v.detach().numpy() for v in model.state_dict().values()]
      return out, int(x.shape[1]), {"loss": loss}

  return Client()


def run_flower(w: Workload, *, rounds: int) -> dict:
  """Flower's simulation engine (Ray) on ``w``: one warm-up round, then ``rounds`` timed."""
  import logging

  import flwr
  from flwr.common import ndarrays_to_parameters
  from flwr.server import ServerConfig
  from flwr.server.strategy import FedAvg
  from flwr.simulation import start_simulation

  logging.getLogger("flwr").setLevel(logging.ERROR)
  times: dict[int, list[float]] = {}

  class TimedFedAvg(FedAvg):
    def configure_fit(self, server_round, parameters, client_manager):
      times[server_round] = [time.perf_counter()]
      return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
      out = super().aggregate_fit(server_round, results, failures)
      times[server_round].append(time.perf_counter())
      times[server_round].append(len(results))
      return out

  init = [v.detach().numpy() for v in torch_model(w).state_dict().values()]
  strategy = TimedFedAvg(
    fraction_fit=w.cohort_size / w.num_clients, fraction_evaluate=0.0,
    min_fit_clients=w.cohort_size, min_evaluate_clients=0, min_available_clients=w.num_clients,
    initial_parameters=ndarrays_to_parameters(init),
  )
  ncpu = os.cpu_count() or 1

  def client_fn(context):
    return _flower_client(int(context.node_config["partition-id"]), w).to_client()

  start_simulation(
    client_fn=client_fn, num_clients=w.num_clients, config=ServerConfig(num_rounds=rounds + 1),
    strategy=strategy, client_resources={"num_cpus": 1, "num_gpus": 0.0},
    ray_init_args={"num_cpus": ncpu, "include_dashboard": False, "log_to_driver": False,
                   "runtime_env": {"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}}},
  )
  timed = [times[r] for r in range(2, rounds + 2) if r in times and len(times[r]) == 3]
  if not timed:
    raise RuntimeError(f"Flower completed no timed round (round records: {times})")
  done = [r[2] for r in timed]
  if min(done) < w.cohort_size:
    raise RuntimeError(f"Flower rounds trained only {done} of {w.cohort_size} clients")
  per_round = float(np.mean([r[1] - r[0] for r in timed]))
  return dict(seconds_per_round=per_round, rounds_timed=len(timed), flwr_version=flwr.__version__,
              actors=ncpu)
