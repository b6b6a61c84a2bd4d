r"""fedtree beside pfl-research in pfl-research's own CIFAR-10 benchmark (issue 41, item 1).

  python -m benchmarks.pfl_cifar10 --procs=1,3,5 --iterations=200     # the benchmark's size (a GPU)
  python -m benchmarks.pfl_cifar10 --tiny                              # a CPU check, ~2 minutes

The setting is pfl-research's ``benchmarks/image_classification`` baseline (Granqvist et al. 2024;
``configs/baseline.yaml``): 1,000 users of 50 CIFAR-10-shaped images, a cohort of 50 per central
iteration, 1 local epoch of SGD (learning rate 0.1) with batch 10, the server's SGD at 1.0 on the
averaged model difference, users weighted alike, the ``simple_cnn`` (conv3x3(32) - conv3x3(64) -
maxpool2 - dropout 0.25 - dense 128 - dropout 0.5 - dense 10), and central evaluation of the
server's model on 10,000 test images every 10 central iterations (batch 10,000). fedtree runs the
same setting as its workload (b) (:func:`benchmarks.workloads.cnn`): FedAvg with the same model,
data, cohort, local and server steps, its rounds fused 10 per call between the evaluations.

pfl runs as its documentation says (``pfl``'s guide "Fast distributed simulations"): its
``FederatedAveraging`` over a ``SimulatedBackend``, the users' data as tensors on the device
(``FederatedDataset.from_slices`` of one ``(x, y)`` slice per user, users drawn at random),
``CentralEvaluationCallback``, and with ``P`` processes sharing the GPU (``--procs``: the guide's
"Multi-process training", each process started with ``PFL_WORKER_ADDRESSES`` / ``PFL_WORKER_RANK``;
"the optimal number of processes per GPU can vary between 1-5": the GPU session runs 1, 3 and 5).
One deviation, forced by pfl 0.6.0 on a single GPU: its PyTorch process group takes the NCCL
backend whenever CUDA is present, and NCCL refuses two ranks on one device, so with ``P > 1`` on a
GPU the workers replace the backend by gloo (``--gloo=auto``), which all-reduces CUDA tensors too;
on a CPU pfl takes gloo itself.

Data: no data set can be downloaded where this runs, so :func:`write_data` writes CIFAR-shaped
stand-ins once (a 32x32x3 low-frequency pattern per class, scaled by 0.07, shifted by up to 4
pixels, plus unit Gaussian noise, 20 % of the labels redrawn at random, standardized per channel as
pfl-research does), and both frameworks read the same arrays: user ``u`` holds rows ``u*50 .. u*50+49``. Both
start from the same initial weights (pfl-research's ``simple_cnn`` initialization: Xavier-uniform
kernels, PyTorch's default biases; :func:`initial_weights`), converted to fedtree's layout by
:func:`to_flax`.

Time: ``--time-limit`` stops a pfl run (at a multiple of 10 iterations past the first 10, all its
processes together) once it has trained that long, and every later run, fedtree's included, then
runs the same number of iterations, so the losses compare after the same iterations. ``--budget``
bounds the whole command: each run's timeout is cut to what is left, fedtree's kept back while
pfl runs, and ``<tag>.json`` is rewritten after every run, so a run killed by an outer timeout
loses itself alone.

Reported per run: seconds per central iteration in steady state (iterations 11 .. N, evaluations
included, the first 10, which compile and warm up, left out) and in all (from the process's start
to its last iteration: imports, data, compilation included), the process CPU seconds per steady
iteration (every process of a multi-process pfl run added up), the ratios of each pfl run's steady
wall and CPU time to fedtree's (on a GPU the wall ratio is the figure; on a shared CPU the CPU
ratio), and the loss and accuracy of the final server model
on all training examples (the training loss) and on the test images, both computed the same way
(the model in evaluation mode, float32). fedtree also runs ``--seeds`` further seeds (loss only)
for the spread that seed noise alone gives, and each pfl run's training loss is called in
agreement when it lies within 3 standard deviations of the seeds' mean (:func:`loss_agreement`).
Writes ``<out-dir>/<tag>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import workloads

STARTED = time.perf_counter()   # this process's start, for the "all" time of a worker

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

SETTING = dict(users=1000, per_user=50, test=10_000, cohort=50, batch_size=10, epochs=1, lr=0.1,
               central_lr=1.0, eval_every=10, eval_batch=10_000)
"""pfl-research's CIFAR-10 baseline (``benchmarks/image_classification/configs/baseline.yaml``)."""

TINY = dict(users=40, per_user=50, test=500, cohort=8, iterations=30, procs="1,2", seeds="0,1", timeout=400.0,
            time_limit=20.0)
"""The CPU check: the same programs on a few users and iterations (the time limit stops a slow
machine's first pfl run at 20 iterations, so the stop and the runs after it are exercised)."""

IMAGE = (32, 32, 3)
CLASSES = 10
WARMUP = 10   # central iterations left out of the steady-state time (compilation, cuDNN/cuBLAS warm-up)
HARD_STOP_MARGIN = 20.0
"""Seconds before its ``--timeout`` at which a pfl run stops (at the next evaluation) whatever
``--time-limit`` says: room for its last 10 iterations, the final scoring and the exit."""
MIN_RUN_S = 20.0
"""A run that ``--budget`` leaves less than this many seconds is skipped, not started."""


# ------------------------------------------------------------------------ data and weights
def cifar_like(n: int, rng: np.random.Generator, patterns: np.ndarray, *, shift: int = 4,
               noise: float = 1.0, label_noise: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
  """``n`` images ``[n, 32, 32, 3]`` of the classes' ``patterns`` ``[10, 32 + 2 shift, 32 + 2 shift, 3]``
  (a window shifted by up to ``shift`` pixels, plus Gaussian ``noise``) and their labels, a
  ``label_noise`` fraction of them redrawn uniformly (so the loss has a floor well above 0)."""
  y = rng.integers(0, CLASSES, n)
  oy, ox = rng.integers(0, 2 * shift + 1, (2, n))
  windows = np.lib.stride_tricks.sliding_window_view(patterns, IMAGE[:2], axis=(1, 2))
  x = np.moveaxis(windows[y, oy, ox], 1, -1)                   # [n, 3, 32, 32] -> [n, 32, 32, 3]
  x = x + noise * rng.standard_normal(x.shape, dtype=np.float32)
  flip = rng.random(n) < label_noise
  y[flip] = rng.integers(0, CLASSES, int(flip.sum()))
  return x.astype(np.float32), y.astype(np.int32)


def initial_weights(seed: int, image=IMAGE) -> dict[str, np.ndarray]:
  """pfl-research's ``simple_cnn`` initialization in PyTorch's layout: Xavier-uniform kernels
  (``U(±sqrt(6 / (fan_in + fan_out)))``) and PyTorch's default biases (``U(±1/sqrt(fan_in))``).
  Keys ``{conv0,conv1,dense0,dense1}.{weight,bias}``; convolutions ``[out, in, 3, 3]``, dense
  ``[out, in]`` with the inputs in PyTorch's flattening order (channel, row, column)."""
  rng = np.random.default_rng(seed)
  side = (image[0] - 4) // 2
  shapes = {"conv0": (32, image[2], 3, 3), "conv1": (64, 32, 3, 3), "dense0": (128, 64 * side * side),
            "dense1": (CLASSES, 128)}
  out = {}
  for name, shape in shapes.items():
    field = int(np.prod(shape[2:])) if len(shape) == 4 else 1
    fan_in, fan_out = shape[1] * field, shape[0] * field
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    out[f"{name}.weight"] = rng.uniform(-bound, bound, shape).astype(np.float32)
    out[f"{name}.bias"] = rng.uniform(-1, 1, shape[0]).astype(np.float32) / np.float32(np.sqrt(fan_in))
  return out


def to_flax(weights: dict[str, np.ndarray]) -> dict:
  """:func:`initial_weights` as the parameters of fedtree's ``cnn`` (``Conv_0``, ``Conv_1``,
  ``Dense_0``, ``Dense_1``; kernels ``[3, 3, in, out]`` and ``[in, out]``, the first dense layer's
  inputs in the (row, column, channel) order of an NHWC flatten)."""
  dense0 = weights["dense0.weight"]
  out_features, channels = dense0.shape[0], weights["conv1.weight"].shape[0]
  side = int(round(np.sqrt(dense0.shape[1] // channels)))
  return {
    "Conv_0": {"kernel": weights["conv0.weight"].transpose(2, 3, 1, 0), "bias": weights["conv0.bias"]},
    "Conv_1": {"kernel": weights["conv1.weight"].transpose(2, 3, 1, 0), "bias": weights["conv1.bias"]},
    "Dense_0": {"kernel": dense0.reshape(out_features, channels, side, side).transpose(2, 3, 1, 0)
                .reshape(side * side * channels, out_features), "bias": weights["dense0.bias"]},
    "Dense_1": {"kernel": weights["dense1.weight"].T, "bias": weights["dense1.bias"]},
  }


def write_data(directory: str, *, users: int, per_user: int, test: int, seed: int = 0,
               signal: float = 0.07) -> dict:
  """Writes ``x_train.npy`` ``[users * per_user, 32, 32, 3]`` (user ``u``: rows ``u * per_user ..``),
  ``y_train.npy``, ``x_test.npy``, ``y_test.npy``, ``init.npz`` (:func:`initial_weights`) and
  ``meta.json`` into ``directory``; images standardized per channel with the training set's
  statistics. ``signal``: the patterns' scale against the unit noise (0.07: a nearest-pattern
  classifier that ignores the shifts is right 62 % of the time). Returns the metadata."""
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  blocks = signal * rng.standard_normal((CLASSES, 5, 5, IMAGE[2])).astype(np.float32)
  patterns = np.repeat(np.repeat(blocks, 8, axis=1), 8, axis=2)           # [10, 40, 40, 3]
  x_train, y_train = cifar_like(users * per_user, rng, patterns)
  x_test, y_test = cifar_like(test, rng, patterns)
  mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64)
  std = x_train.std(axis=(0, 1, 2), dtype=np.float64)
  for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
    np.save(os.path.join(directory, f"x_{name}.npy"), ((x - mean) / std).astype(np.float32))
    np.save(os.path.join(directory, f"y_{name}.npy"), y)
  np.savez(os.path.join(directory, "init.npz"), **initial_weights(seed))
  meta = dict(users=users, per_user=per_user, test=test, seed=seed, signal=signal, source="generated")
  with open(os.path.join(directory, "meta.json"), "w") as f:
    json.dump(meta, f)
  return meta


def load_data(directory: str) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
  """``(meta, arrays, initial weights)`` written by :func:`write_data`."""
  with open(os.path.join(directory, "meta.json")) as f:
    meta = json.load(f)
  arrays = {k: np.load(os.path.join(directory, f"{k}.npy"))
            for k in ("x_train", "y_train", "x_test", "y_test")}
  with np.load(os.path.join(directory, "init.npz")) as z:
    init = {k: z[k] for k in z.files}
  return meta, arrays, init


def workload(meta: dict, cohort: int) -> workloads.Workload:
  """fedtree's workload (b) on the written data: its users, images per user and cohort."""
  w = workloads.cnn(meta["users"], cohort)
  return dataclasses.replace(w, examples=meta["per_user"], batch_size=SETTING["batch_size"],
                             local_steps=SETTING["epochs"] * meta["per_user"] // SETTING["batch_size"],
                             lr=SETTING["lr"], server_lr=SETTING["central_lr"])


# ------------------------------------------------------------------------ the pfl worker
def _pfl_classifier(net):
  """pfl's ``PyTorchModel`` contract around ``net`` (an NCHW ``nn.Sequential``): NHWC inputs,
  ``loss(x, y, eval=False)`` and ``metrics(x, y, eval=True)`` returning pfl ``Weighted`` sums."""
  import torch
  import torch.nn.functional as F
  from pfl.metrics import Weighted

  class Classifier(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.net = net

    def forward(self, x):
      return self.net(x.permute(0, 3, 1, 2))

    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's keyword
      self.train(not eval)
      return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):  # noqa: A002 - pfl's keyword
      self.train(not eval)
      logits = self(x)
      n = int(y.shape[0])
      return {"loss": Weighted(F.cross_entropy(logits, y, reduction="sum").item(), n),
              "accuracy": Weighted((logits.argmax(-1) == y).sum().item(), n)}

  return Classifier()


def _use_gloo() -> None:
  """Makes ``torch.distributed.init_process_group`` take the gloo backend (see the module
  docstring: NCCL refuses two ranks of one process group on the same GPU)."""
  import torch.distributed as dist

  init = dist.init_process_group

  def gloo_init(*args, backend=None, **kwargs):
    return init(*args, backend="gloo", **kwargs)

  dist.init_process_group = gloo_init


def _torch_eval(model, x, y, batch: int, device) -> tuple[float, float]:
  """Mean cross-entropy and accuracy of ``model`` (evaluation mode) on numpy ``x``, ``y``."""
  import torch
  import torch.nn.functional as F

  model.eval()
  loss, correct = 0.0, 0
  with torch.no_grad():
    for i in range(0, len(y), batch):
      xb = torch.as_tensor(x[i:i + batch], device=device)
      yb = torch.as_tensor(y[i:i + batch], dtype=torch.int64, device=device)
      logits = model(xb)
      loss += float(F.cross_entropy(logits, yb, reduction="sum"))
      correct += int((logits.argmax(-1) == yb).sum())
  return loss / len(y), correct / len(y)


def pfl_worker(a) -> dict:
  """One pfl process (rank ``PFL_WORKER_RANK`` of ``--procs``): the benchmark's run; returns its
  clock, and on rank 0 also the final model's losses."""
  procs = len(os.environ.get("PFL_WORKER_ADDRESSES", "x").split(","))
  rank = int(os.environ.get("PFL_WORKER_RANK", 0))
  import torch

  if procs > 1 and a.gloo != "off" and (a.gloo == "on" or torch.cuda.is_available()):
    _use_gloo()
  # One intra-op thread per process on a CPU (OpenMP threads spin against each other and against
  # other processes: benchmarks/README.md, the PyTorch loop), the cores shared out on a GPU machine.
  torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs) if torch.cuda.is_available() else 1)
  torch.manual_seed(a.seed)
  np.random.seed(a.seed)   # noqa: NPY002 - pfl draws its users from numpy's global generator
  import pfl
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.aggregate.weighting import WeightByUser
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.callback.base import TrainingProcessCallback
  from pfl.callback.central_evaluation import CentralEvaluationCallback
  from pfl.data.dataset import Dataset
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler
  from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
  from pfl.internal.ops.pytorch_ops import get_default_device, to_tensor
  from pfl.model.pytorch import PyTorchModel

  from benchmarks.peers import torch_model

  meta, arr, init = load_data(a.data)
  users, m = meta["users"], meta["per_user"]
  device = get_default_device()
  x = to_tensor(arr["x_train"])                                     # on the device, as pfl-research does
  y = torch.as_tensor(arr["y_train"], dtype=torch.int64, device=device)
  slices = {u: (x[u * m:(u + 1) * m], y[u * m:(u + 1) * m]) for u in range(users)}
  train = FederatedDataset.from_slices(slices, get_user_sampler("random", list(range(users))))
  central = Dataset(raw_data=[to_tensor(arr["x_test"]),
                              torch.as_tensor(arr["y_test"], dtype=torch.int64, device=device)])

  net = torch_model(workload(meta, a.cohort))
  layers = [mod for mod in net if hasattr(mod, "weight")]
  with torch.no_grad():
    for name, layer in zip(("conv0", "conv1", "dense0", "dense1"), layers, strict=True):
      layer.weight.copy_(torch.from_numpy(init[f"{name}.weight"]))
      layer.bias.copy_(torch.from_numpy(init[f"{name}.bias"]))
  classifier = _pfl_classifier(net)
  params = [p for p in classifier.parameters() if p.requires_grad]
  model = PyTorchModel(model=classifier, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(params, SETTING["central_lr"]))
  backend = SimulatedBackend(training_data=train, val_data=train, postprocessors=[WeightByUser()])

  clock: dict[str, list[float]] = {"wall": [], "cpu": []}

  class Clock(TrainingProcessCallback):
    """Wall and CPU time after every central iteration; stops at a multiple of the evaluation
    period (so the losses stay comparable) once training has run ``--time-limit`` seconds or the
    process has run to :data:`HARD_STOP_MARGIN` seconds before its timeout (so a slow start
    still leaves a result rather than a killed run). With several processes the ranks decide
    together (an all-reduce of the flag): pfl stops each rank on its own callbacks' word, and a
    rank that stopped alone would leave the others waiting in the next all-reduce."""

    def on_train_begin(self, *, model):
      clock["wall"].append(time.perf_counter())
      clock["cpu"].append(time.process_time())
      return super().on_train_begin(model=model)

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      clock["wall"].append(time.perf_counter())
      clock["cpu"].append(time.process_time())
      metrics = super().after_central_iteration(aggregate_metrics, model,
                                                central_iteration=central_iteration)[1]
      done = central_iteration + 1
      if done % SETTING["eval_every"] or done <= WARMUP:   # a stop leaves steady iterations to time
        return False, metrics
      now = clock["wall"][-1]
      late = now - clock["wall"][0] > a.time_limit or now - STARTED > a.timeout - HARD_STOP_MARGIN
      if procs > 1:
        import torch.distributed as dist

        flag = torch.tensor([float(late)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        late = bool(flag.item() > 0)
      return late, metrics

  eval_params = NNEvalHyperParams(local_batch_size=SETTING["eval_batch"])
  algorithm = FederatedAveraging()
  algorithm.run(
    algorithm_params=NNAlgorithmParams(central_num_iterations=a.iterations,
                                       evaluation_frequency=SETTING["eval_every"],
                                       train_cohort_size=a.cohort, val_cohort_size=0),
    backend=backend, model=model,
    model_train_params=NNTrainHyperParams(local_learning_rate=SETTING["lr"],
                                          local_num_epochs=SETTING["epochs"],
                                          local_batch_size=SETTING["batch_size"]),
    model_eval_params=eval_params,
    callbacks=[CentralEvaluationCallback(central, model_eval_params=eval_params,
                                         frequency=SETTING["eval_every"]), Clock()])
  out = dict(rank=rank, procs=procs, iterations=len(clock["wall"]) - 1, wall=clock["wall"], cpu=clock["cpu"],
             started=STARTED,
             pfl_version=pfl.__version__, torch_version=torch.__version__, device=str(device),
             gloo_forced=bool(procs > 1 and dist_backend_forced()))
  if torch.cuda.is_available():
    out["gpu"] = torch.cuda.get_device_name()
  if rank == 0:
    batch = SETTING["eval_batch"]
    for part in ("train", "test"):
      loss, accuracy = _torch_eval(classifier, arr[f"x_{part}"], arr[f"y_{part}"], batch, device)
      out[f"{part}_loss"], out[f"{part}_accuracy"] = loss, accuracy
  return out


def dist_backend_forced() -> bool:
  import torch.distributed as dist

  return getattr(dist.init_process_group, "__name__", "") == "gloo_init"


# ------------------------------------------------------------------------ the fedtree worker
def fedtree_worker(a) -> dict:
  """fedtree's workload (b) on the written data: ``--iterations`` rounds, 10 fused per call, the
  test images scored after every call (timed); then ``--seeds`` more runs for the losses alone, as
  many as start before :data:`HARD_STOP_MARGIN` seconds before the run's timeout."""
  import jax
  import jax.numpy as jnp
  import optax

  from benchmarks.jax_runners import build_fedtree, jax_model
  from fedtree.core.data import FederatedData
  from fedtree.core.loop import compile_rounds

  meta, arr, init = load_data(a.data)
  users, m = meta["users"], meta["per_user"]
  w = workload(meta, a.cohort)
  data = FederatedData(
    x_train=jnp.asarray(arr["x_train"].reshape((users, m) + IMAGE)),
    y_train=jnp.asarray(arr["y_train"].reshape(users, m)), n_train=jnp.full((users,), m, jnp.int32),
    x_test=jnp.zeros((users, 1) + IMAGE, jnp.float32), y_test=jnp.zeros((users, 1), jnp.int32),
    n_test=jnp.ones((users,), jnp.int32), num_classes=CLASSES)
  model = jax_model(w)
  alg, chunk = build_fedtree(w, data, init_params=jax.tree.map(jnp.asarray, to_flax(init)),
                             weighting="uniform")
  period = SETTING["eval_every"]
  step = compile_rounds(alg, period)

  def scores(params, x, y):
    logits = model.apply(params, x, train=False).astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()
    return loss, (logits.argmax(-1) == y).sum()

  score = jax.jit(scores)

  def evaluate(params, x, y):
    sums = [score(params, x[i:i + SETTING["eval_batch"]], y[i:i + SETTING["eval_batch"]])
            for i in range(0, len(y), SETTING["eval_batch"])]
    return sum(s[0] for s in sums) / len(y), sum(s[1] for s in sums) / len(y)

  x_test, y_test = jnp.asarray(arr["x_test"]), jnp.asarray(arr["y_test"])
  x_all, y_all = jnp.asarray(arr["x_train"]), jnp.asarray(arr["y_train"])

  def global_model(state):
    return jax.tree.map(lambda p: p[0], state.params[0])

  def run(seed: int, timed: bool) -> dict:
    state = alg.init(jax.random.key(seed))
    key = jax.random.key(seed + 1)
    wall, cpu = [time.perf_counter()], [time.process_time()]
    for c in range(a.iterations // period):
      state, metrics = step(state, data, jax.random.fold_in(key, c))
      jax.block_until_ready(evaluate(global_model(state), x_test, y_test))   # the benchmark's evaluation
      wall.append(time.perf_counter())
      cpu.append(time.process_time())
    params = global_model(state)
    res = dict(seed=seed, iterations=a.iterations)
    res["train_loss"], res["train_accuracy"] = (float(v) for v in evaluate(params, x_all, y_all))
    res["test_loss"], res["test_accuracy"] = (float(v) for v in evaluate(params, x_test, y_test))
    res["local_train_loss"] = float(np.asarray(metrics["train_loss"])[-1])
    if timed:
      res.update(wall=wall, cpu=cpu, started=STARTED)
    return res

  first = run(a.seed, timed=True)
  others = []
  for s in (s for s in a.seed_list if s != a.seed):   # the seeds that fit before the run's timeout
    if time.perf_counter() - STARTED > a.timeout - HARD_STOP_MARGIN:
      break
    others.append(run(s, timed=False))
  compiles = step._cache_size() if hasattr(step, "_cache_size") else None
  return dict(first, chunk_size=chunk, backend=jax.default_backend(), device=jax.devices()[0].device_kind,
              jax_version=jax.__version__, compiles=compiles, seeds=[first] + others)


# ------------------------------------------------------------------------ orchestration
def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _worker_cmd(a, worker: str, **over) -> list[str]:
  args = dict(data=a.data, iterations=a.iterations, cohort=a.cohort, seed=a.seed, seeds=a.seeds,
              time_limit=a.time_limit, gloo=a.gloo, timeout=a.timeout)
  args.update(over)
  return [sys.executable, "-m", "benchmarks.pfl_cifar10", f"--worker={worker}"] + [
    f"--{k.replace('_', '-')}={v}" for k, v in args.items()]


def _results(out: str) -> list[dict]:
  return [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]


def launch(a, worker: str, procs: int = 1, timeout: float | None = None, command=None) -> dict:
  """Runs ``worker`` in ``procs`` subprocesses (pfl's multi-process mode when ``procs > 1``),
  waits at most ``timeout`` (default ``--timeout``) seconds, and returns rank 0's result with the
  ranks' CPU time.

  Each rank writes to files, not pipes: with pipes read one rank at a time, a rank whose output
  passed a pipe's 64 KB blocked on its write while rank 0 waited for it in the next all-reduce,
  until the timeout killed the run (tests/test_benchmarks_gpu_session.py). The likely cause of the
  H100's 200-iteration pfl runs with 3 and 5 processes killed at their timeouts (issue 41), where
  the time-limited 50-iteration runs finished; not confirmed there. ``command(rank)`` replaces the
  worker's command line (tests)."""
  timeout = a.timeout if timeout is None else timeout
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // procs)))
  if procs > 1:
    env["PFL_WORKER_ADDRESSES"] = ",".join(f"localhost:{_free_port()}" for _ in range(procs))
  started = time.perf_counter()
  with tempfile.TemporaryDirectory() as logs:
    children, files = [], []
    for rank in range(procs):
      env_r = dict(env, PFL_WORKER_RANK=str(rank)) if procs > 1 else env
      out_f = open(os.path.join(logs, f"{rank}.out"), "w+")   # noqa: SIM115 - closed below
      err_f = open(os.path.join(logs, f"{rank}.err"), "w+")   # noqa: SIM115
      files.append((out_f, err_f))
      argv = command(rank) if command is not None else _worker_cmd(a, worker, timeout=timeout)
      children.append(subprocess.Popen(argv, env=env_r, cwd=ROOT, text=True, stdout=out_f, stderr=err_f))
    failed = None
    deadline = started + timeout
    for child in children:
      try:
        child.wait(timeout=max(1.0, deadline - time.perf_counter()))
      except subprocess.TimeoutExpired:
        failed = f"timed out after {timeout:.0f} s"
        for c in children:
          if c.poll() is None:
            c.kill()
        child.wait()
    for c in children:
      c.wait()
    outs = []
    for child, (out_f, err_f) in zip(children, files, strict=True):
      out_f.seek(0)
      err_f.seek(0)
      outs.append((child.returncode, out_f.read(), err_f.read()))
      out_f.close()
      err_f.close()
  total = time.perf_counter() - started
  res = [r for _, out, _ in outs for r in _results(out)]
  head = next((r for r in res if r.get("rank", 0) == 0), None)
  if head is None or failed:
    tail = next((err for rc, _, err in outs if rc), outs[0][2])
    return dict(skipped=failed or f"worker failed: {tail.strip()[-600:]}", procs=procs)
  head["launch_s"] = total
  head["cpu_all_ranks"] = [sum(r["cpu"][i] - r["cpu"][0] for r in res) for i in range(len(head["cpu"]))] \
    if all(len(r["cpu"]) == len(head["cpu"]) for r in res) else None
  return head


def summarize(r: dict) -> dict:
  """Steady and overall seconds (and CPU seconds) per central iteration from a result's clock."""
  wall, n = r["wall"], r["iterations"]
  per = (len(wall) - 1) / max(n, 1)                    # clock entries per iteration (1 for pfl, 1/10 fedtree)
  skip = int(round(WARMUP * per))
  out = dict(iterations=n, steady_s=(wall[-1] - wall[skip]) / max(n - WARMUP, 1),
             all_s=(wall[-1] - r["started"]) / max(n, 1))
  cpu = r.get("cpu_all_ranks") or [c - r["cpu"][0] for c in r["cpu"]]
  out["steady_cpu_s"] = (cpu[-1] - cpu[skip]) / max(n - WARMUP, 1)
  return out


def table(rows: list[dict], meta: dict, cohort: int, device: str) -> str:
  head = (f"pfl-research's CIFAR-10 benchmark on {device}: {meta['users']} users x {meta['per_user']} images "
          f"({meta['source']}), cohort {cohort}, 1 epoch of batch {SETTING['batch_size']}, evaluation every "
          f"{SETTING['eval_every']} iterations on {meta['test']} test images\n"
          f"{'runner':<16}{'iterations':>11}{'s/iter':>10}{'CPU s/iter':>11}{'all s/iter':>11}"
          f"{'pfl/fedtree':>12}{'(CPU)':>8}{'train loss':>11}{'test loss':>10}{'test acc':>9}")
  lines = [head, "-" * len(head.splitlines()[-1])]
  base = next((r for r in rows if r["runner"] == "fedtree" and "skipped" not in r), None)
  for r in rows:
    if "skipped" in r:
      lines.append(f"{r['label']:<16}  skipped: {r['skipped']}")
      continue
    ratio = cpu = ""
    if base is not None and r is not base:
      ratio = f"{r['steady_s'] / base['steady_s']:.2f}x"
      cpu = f"{r['steady_cpu_s'] / base['steady_cpu_s']:.2f}x"
    lines.append(f"{r['label']:<16}{r['iterations']:>11}{r['steady_s']:>10.4f}{r['steady_cpu_s']:>11.4f}"
                 f"{r['all_s']:>11.4f}{ratio:>12}{cpu:>8}{r['train_loss']:>11.4f}{r['test_loss']:>10.4f}"
                 f"{r['test_accuracy']:>9.3f}")
  if base is not None and len(base.get("seeds", [])) > 1:
    losses = [s["train_loss"] for s in base["seeds"]]
    lines.append(f"fedtree seeds {[s['seed'] for s in base['seeds']]}: train loss {min(losses):.4f} .. "
                 f"{max(losses):.4f} (mean {np.mean(losses):.4f}, std {np.std(losses, ddof=1):.4f})")
    for r in rows:
      verdict = loss_agreement(r, base)
      if verdict:
        lines.append(f"{r['label']}: {verdict}")
  return "\n".join(lines)


def loss_agreement(r: dict, base: dict) -> str:
  """Whether pfl run ``r``'s final training loss agrees with fedtree's (``base``) within seed
  noise: within 3 standard deviations (ddof 1) of the mean over fedtree's seeds, after the same
  number of central iterations; ``""`` where there is nothing to compare."""
  seeds = [s["train_loss"] for s in base.get("seeds", [])]
  if r is base or "skipped" in r or r.get("runner") != "pfl" or len(seeds) < 2:
    return ""
  if r["iterations"] != base["iterations"]:
    return f"not compared ({r['iterations']} iterations against fedtree's {base['iterations']})"
  mean, std = float(np.mean(seeds)), float(np.std(seeds, ddof=1))
  z = (r["train_loss"] - mean) / std if std > 0 else float("inf")
  word = "agrees with" if abs(z) <= 3 else "DIFFERS from"
  return (f"train loss {r['train_loss']:.4f} {word} fedtree's {mean:.4f} +- 3 x {std:.4f} over "
          f"{len(seeds)} seeds ({z:+.1f} std)")


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tiny", action="store_true", help=f"the CPU check: {TINY}")
  p.add_argument("--users", type=int, default=SETTING["users"])
  p.add_argument("--per-user", type=int, default=SETTING["per_user"])
  p.add_argument("--test", type=int, default=SETTING["test"])
  p.add_argument("--cohort", type=int, default=SETTING["cohort"])
  p.add_argument("--iterations", type=int, default=200, help="central iterations (a multiple of 10)")
  p.add_argument("--procs", default="1,3,5", help="pfl runs: processes sharing the device, one run each")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--seeds", default="0,1,2,3,4", help="fedtree seeds (the first timed, all scored)")
  p.add_argument("--frameworks", default="pfl,fedtree")
  p.add_argument("--gloo", default="auto", choices=("auto", "on", "off"),
                 help="pfl with --procs > 1: gloo instead of NCCL (auto: on a GPU)")
  p.add_argument("--timeout", type=float, default=150.0, help="seconds per run (all its processes)")
  p.add_argument("--time-limit", type=float, default=1e9,
                 help="a pfl run stops after this many seconds (at a multiple of 10 iterations); fedtree "
                      "then runs as many iterations as the shortest pfl run")
  p.add_argument("--budget", type=float, default=None,
                 help="seconds for the whole command: each run's timeout is cut to what is left (the "
                      "fedtree run's --timeout kept back while pfl runs), a run left under "
                      f"{MIN_RUN_S:.0f} s is skipped")
  p.add_argument("--data", default=None,
                 help="data directory, written there unless it holds data (default: under --out-dir)")
  p.add_argument("--tag", default="pfl_cifar10")
  p.add_argument("--out-dir", default=RESULTS)
  p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.tiny:
    for k, v in TINY.items():
      if p.get_default(k.replace("-", "_")) == getattr(a, k.replace("-", "_")):
        setattr(a, k, v)
  a.seed_list = [int(s) for s in str(a.seeds).split(",") if s != ""]
  if a.iterations % SETTING["eval_every"] or a.iterations <= WARMUP:
    raise SystemExit(f"--iterations={a.iterations}: a multiple of {SETTING['eval_every']} above {WARMUP}")
  if a.worker:
    res = pfl_worker(a) if a.worker == "pfl" else fedtree_worker(a)
    print("RESULT " + json.dumps(res), flush=True)
    return [res]

  procs = [int(v) for v in a.procs.split(",") if v]
  frameworks = [f for f in a.frameworks.split(",") if f]
  os.makedirs(a.out_dir, exist_ok=True)
  if a.data is None:
    a.data = os.path.join(a.out_dir, f"{a.tag}_data")
  if not os.path.exists(os.path.join(a.data, "meta.json")):
    t = time.perf_counter()
    write_data(a.data, users=a.users, per_user=a.per_user, test=a.test, seed=a.seed)
    print(f"data written to {a.data} ({time.perf_counter() - t:.1f} s)", flush=True)
  meta = load_data(a.data)[0]
  runs = [(fw, n) for fw in frameworks for n in (procs if fw == "pfl" else [1])]
  rows: list[dict] = []
  for i, (fw, n) in enumerate(runs):
    done = [r["iterations"] for r in rows if "skipped" not in r]
    if done and min(done) < a.iterations:
      a.iterations = min(done)     # a run stopped at its time limit: the rest run as many iterations
    label = f"pfl, {n} proc{'s' if n > 1 else ''}" if fw == "pfl" else "fedtree"
    timeout = a.timeout
    if a.budget is not None:       # keep the later fedtree run's --timeout back while pfl runs
      later = a.timeout if any(f == "fedtree" for f, _ in runs[i + 1:]) else 0.0
      timeout = min(a.timeout, a.budget - (time.perf_counter() - STARTED) - later)
    print(f"running {label} ...", flush=True)
    if timeout < MIN_RUN_S:
      r = dict(skipped=f"out of the --budget of {a.budget:.0f} s", procs=n)
    else:
      r = launch(a, fw, n, timeout)
    r.update(runner=fw, label=label)
    if "skipped" not in r:
      r.update(summarize(r))
      print(f"    {r['steady_s']:.4f} s/iteration (steady), {r['iterations']} iterations, "
            f"train loss {r['train_loss']:.4f}", flush=True)
    else:
      print(f"    skipped: {r['skipped']}", flush=True)
    rows.append(r)
    write_results(a, argv, meta, rows, final=i == len(runs) - 1)   # after every run: a kill keeps the rest
  return rows


def write_results(a, argv, meta: dict, rows: list[dict], *, final: bool) -> None:
  """``<out-dir>/<tag>.json`` of the runs so far (``complete`` once all have run); prints the table
  when ``final``."""
  device = next((r.get("gpu") or r.get("device") for r in rows if "skipped" not in r), "?")
  text = table(rows, meta, a.cohort, device)
  if final:
    print(text, flush=True)
  with open(os.path.join(a.out_dir, f"{a.tag}.json"), "w") as f:
    json.dump(dict(setting=SETTING, meta=meta, cohort=a.cohort, argv=sys.argv[1:] if argv is None else argv,
                   load_average=os.getloadavg(), device=device, complete=final, table=text, results=rows),
              f, indent=1)


if __name__ == "__main__":
  main()
