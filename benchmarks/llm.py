r"""Federated LoRA fine-tuning of a pretrained decoder: fedtree's cohort batched over one frozen base
against the sequential per-client loop of transformers + peft (issue 50's measurement).

  python -m benchmarks.llm                      # ~125 M-parameter Llama shape, seq 256, K = 1, 4, 8, 16
  python -m benchmarks.llm --tiny               # a 2-layer toy, K = 1, 2 (a smoke run)

One random Llama-shaped checkpoint (``--hidden``, ``--layers``, ``--heads``, ``--kv_heads``,
``--intermediate``, ``--vocab``; the default is 12 layers of width 768 with grouped-query attention
(12 heads over 4) and a 32,000-token vocabulary, 124.9 M parameters) is written once with
``transformers`` (``save_pretrained``) and read by both sides: fedtree through
:func:`fedtree.models.load_pretrained`, transformers through ``AutoModelForCausalLM.from_pretrained``.
Both train rank-``--rank`` LoRA adapters (alpha 2r) on ``q_proj`` and ``v_proj`` over the same data:
every one of ``K`` clients takes ``--steps`` Adam steps of ``--batch_size`` random sequences of
``--seq_len`` tokens (loss on every next token), then the adapters are averaged (FedAvg):

* ``fedtree``: :func:`fedtree.toolbox.lora.frozen_base` of FedAvg, the whole cohort in one compiled
  round (``chunk_size=None``: every client's forward and backward vmapped through the one base);
* ``torch+peft``: the loop FL simulators run (Flower's FlowerTune, OpenFedLLM, FederatedScope-LLM): one
  model wrapped by ``peft.get_peft_model``, each client in turn loading the global adapters, a fresh
  ``torch.optim.Adam`` over them, its steps, its adapters summed into the mean.

Each side runs in a process of its own (``--worker``), so that its peak resident memory is its own:
``peak_rss_MB`` (``VmHWM``: the runtime, the model, data and everything the round holds), and for
fedtree also ``compiled_MB``, the compiled round's ``memory_analysis()`` (arguments + temporaries +
outputs - aliased). ``tokens_per_s`` = K x steps x batch x seq_len / the best of ``--repeats`` timed
rounds after an untimed one (fedtree's program is compiled ahead of the timing).

``MFU``: model FLOPs per second over this machine's measured peak, the best rate of a ``--gemm``-square
matrix product in JAX (``--gemm_dtype``), measured by each worker right after its rounds: on a shared
machine the peak moves with the load, so each row is over the peak of its own moment (``peak_GFLOPs``;
the run's first measurement is the table's header). Model FLOPs of one trained
token with the base frozen: the forward ``2 N`` and the backward's input gradients ``2 N`` (no weight
gradient of the base), ``N`` the matrix parameters (attention, MLP, output projection; not the
embedding lookup), plus attention's scores and mixing ``8 L T d_q`` (forward and backward), plus
``6 n`` for the ``n`` adapter parameters; rematerialization is not counted (model, not hardware, FLOPs).

Writes ``benchmarks/results/llm.json`` and prints a Markdown table (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

RESULTS = os.path.join(os.path.dirname(__file__), "results")
MB = 1e6


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--hidden", type=int, default=768)
  p.add_argument("--layers", type=int, default=12)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--kv_heads", type=int, default=4)
  p.add_argument("--intermediate", type=int, default=2048)
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--seq_len", type=int, default=256)
  p.add_argument("--clients", default="1,4,8,16", help="K values, comma-separated")
  p.add_argument("--batch_size", type=int, default=2)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--rank", type=int, default=8)
  p.add_argument(
    "--dtype",
    default="float32",
    choices=("float32", "bfloat16"),
    help="the base's dtype (and compute); adapters are float32",
  )
  p.add_argument("--remat", action="store_true", help="fedtree: recompute every layer in the backward")
  p.add_argument("--frameworks", default="fedtree,torch")
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--gemm", type=int, default=2048)
  p.add_argument(
    "--gemm_dtype",
    default="float32",
    choices=("float32", "bfloat16"),
    help="the dtype of the peak-rate matrix product (bfloat16 for a bfloat16 run on a GPU)",
  )
  p.add_argument("--tiny", action="store_true", help="a 2-layer toy model, K = 1, 2")
  p.add_argument("--tag", default="llm")
  p.add_argument("--out_dir", default=RESULTS)
  p.add_argument("--checkpoint", default=None, help="(worker) the checkpoint directory")
  p.add_argument("--worker", default=None, choices=("fedtree", "torch"), help="(internal) one side, one K")
  p.add_argument("--k", type=int, default=1, help="(worker) the cohort")
  a = p.parse_args(argv)
  if a.tiny:
    a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab = 64, 2, 4, 2, 128, 512
    a.seq_len, a.clients, a.repeats, a.gemm = 64, "1,2", 1, 512
  return a


# ------------------------------------------------------------------------ the shared checkpoint and data
def write_checkpoint(a, directory: str) -> int:
  """A random Llama of the arguments' shape, saved by transformers; returns its parameter count."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM

  torch.manual_seed(0)
  config = LlamaConfig(
    vocab_size=a.vocab,
    hidden_size=a.hidden,
    intermediate_size=a.intermediate,
    num_hidden_layers=a.layers,
    num_attention_heads=a.heads,
    num_key_value_heads=a.kv_heads,
    max_position_embeddings=max(2048, a.seq_len),
    tie_word_embeddings=False,
  )
  model = LlamaForCausalLM(config)
  model.save_pretrained(directory)
  return int(sum(p.numel() for p in model.parameters()))


def tokens(a, k: int) -> np.ndarray:
  """``int32[K, steps * batch, seq_len + 1]``: every client's sequences (the same for both sides)."""
  rng = np.random.default_rng(0)
  return rng.integers(3, a.vocab, (k, a.steps * a.batch_size, a.seq_len + 1)).astype(np.int32)


def model_flops_per_token(a) -> float:
  """The module docstring's model FLOPs of one trained token (base frozen, LoRA on q and v)."""
  hd = a.hidden // a.heads
  q, kv = a.heads * hd, a.kv_heads * hd
  matrices = a.layers * (a.hidden * (q + 2 * kv) + q * a.hidden + 3 * a.hidden * a.intermediate)
  matrices += a.hidden * a.vocab
  adapters = a.layers * a.rank * ((a.hidden + q) + (a.hidden + kv))
  return 4.0 * matrices + 8.0 * a.layers * a.seq_len * q + 6.0 * adapters


def model_params(a) -> int:
  """Parameters of the Llama shape of the arguments (untied embeddings)."""
  hd = a.hidden // a.heads
  q, kv = a.heads * hd, a.kv_heads * hd
  layer = a.hidden * (q + 2 * kv) + q * a.hidden + 3 * a.hidden * a.intermediate + 2 * a.hidden
  return a.layers * layer + 2 * a.vocab * a.hidden + a.hidden


def gemm_peak(n: int, dtype: str = "float32", repeats: int = 5) -> float:
  """This machine's matrix-product rate in JAX at ``dtype``, FLOP/s (best of ``repeats``)."""
  import jax
  import jax.numpy as jnp

  x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda u: u @ u)
  f(x).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(x).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n**3 / best


# ------------------------------------------------------------------------ the two sides
def run_fedtree(a) -> dict:
  import jax
  import jax.numpy as jnp
  import optax

  from fedtree.algorithms import fedavg
  from fedtree.core.data import FederatedData
  from fedtree.core.local import LocalSchedule
  from fedtree.core.loop import make_multi_round
  from fedtree.models import load_pretrained
  from fedtree.toolbox import lora

  k = a.k
  if a.checkpoint:
    model, base = load_pretrained(
      a.checkpoint, seq_len=a.seq_len, dtype=a.dtype, remat=a.remat, tokenizer=False
    )
  else:  # no transformers to write a checkpoint with (a GPU image): the same shape, drawn by fedtree
    from fedtree.models import DecoderConfig, decoder_model

    model = decoder_model(
      DecoderConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        num_layers=a.layers,
        num_heads=a.heads,
        num_kv_heads=a.kv_heads,
        head_dim=a.hidden // a.heads,
        intermediate_size=a.intermediate,
        max_positions=max(2048, a.seq_len),
        remat=a.remat,
      ),
      a.seq_len,
    )
    base = jax.tree.map(lambda p: p.astype(a.dtype), jax.jit(model.init)(jax.random.key(0)))
  w = tokens(a, k)
  x, y = jnp.asarray(w[..., :-1]), jnp.asarray(w[..., 1:])
  n = jnp.full((k,), w.shape[1], jnp.int32)
  data = FederatedData(
    x_train=x,
    y_train=y,
    n_train=n,
    x_test=x[:, :1],
    y_test=y[:, :1],
    n_test=jnp.ones((k,), jnp.int32),
    num_classes=a.vocab,
  )
  spec = lora.lora(rank=a.rank, alpha=2.0 * a.rank, targets=(r"(q_proj|v_proj)/kernel$",))
  schedule = LocalSchedule(batch_size=a.batch_size, steps=a.steps, batch_order="fixed")
  alg = lora.frozen_base(
    lambda m: fedavg(
      model=m, data=data, local_optimizer=optax.adam(1e-4), schedule=schedule, chunk_size=None
    ),
    model=model,
    spec=spec,
    base=base,
  )
  del base
  state = alg.init(jax.random.key(0))
  t = time.perf_counter()
  compiled = (
    jax.jit(make_multi_round(alg, 1, check_state=False)).lower(state, data, jax.random.key(1)).compile()
  )
  compile_s = time.perf_counter() - t
  m = compiled.memory_analysis()
  peak = m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  times = []
  for r in range(a.repeats + 1):
    t = time.perf_counter()
    state, metrics = compiled(state, data, jax.random.key(r))
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t)
  loss = float(np.asarray(metrics["train_loss"]).ravel()[-1])
  return {"round_s": min(times[1:]), "compile_s": compile_s, "compiled_MB": peak / MB, "loss": loss}


def run_torch(a) -> dict:
  import torch
  from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
  from transformers import AutoModelForCausalLM

  torch.set_num_threads(os.cpu_count() or 1)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
  base = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=dtype).to(device)
  model = get_peft_model(
    base,
    LoraConfig(
      r=a.rank,
      lora_alpha=2 * a.rank,
      target_modules=["q_proj", "v_proj"],
      lora_dropout=0.0,
      task_type="CAUSAL_LM",
    ),
  )
  for p in model.parameters():  # float32 adapter masters, as fedtree's
    if p.requires_grad:
      p.data = p.data.float()
  model.train()
  w = torch.tensor(tokens(a, a.k).astype(np.int64), device=device)
  glob = {n: v.clone() for n, v in get_peft_model_state_dict(model).items()}

  def one_round():
    total = None
    loss = None
    for c in range(a.k):
      set_peft_model_state_dict(model, glob)
      opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
      for s in range(a.steps):
        batch = w[c, s * a.batch_size : (s + 1) * a.batch_size]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
          logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
          logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
      sent = get_peft_model_state_dict(model)
      total = (
        {n: v.detach().clone() for n, v in sent.items()}
        if total is None
        else {n: total[n] + sent[n].detach() for n in total}
      )
    for n in glob:
      glob[n] = total[n] / a.k
    return float(loss)

  times = []
  for _ in range(a.repeats + 1):
    t = time.perf_counter()
    loss = one_round()
    if device == "cuda":
      torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
  out = {"round_s": min(times[1:]), "loss": loss}
  if device == "cuda":
    out["device_peak_MB"] = torch.cuda.max_memory_allocated() / MB
  return out


def peak_rss() -> float:
  """This process's peak resident memory in bytes: ``VmHWM`` (Linux; ``ru_maxrss`` would carry the
  launching process's peak across ``exec``), else ``ru_maxrss``."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return float(line.split()[1]) * 1024
  except OSError:
    pass
  return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def worker(a) -> None:
  out = run_fedtree(a) if a.worker == "fedtree" else run_torch(a)
  out["peak_rss_MB"] = peak_rss() / MB
  out["peak_GFLOPs"] = gemm_peak(a.gemm, a.gemm_dtype) / 1e9   # measured now, beside the round
  print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------------ the table
def main(argv=None) -> dict:
  a = parse(argv)
  if a.worker:
    worker(a)
    return {}
  os.makedirs(a.out_dir, exist_ok=True)
  directory = tempfile.mkdtemp(prefix="fedtree_llm_")
  if "torch" in a.frameworks.split(","):
    params = write_checkpoint(a, directory)
  else:  # fedtree alone: it draws the same shape itself (no transformers needed)
    directory = ""
    params = int(model_params(a))
  peak = gemm_peak(a.gemm, a.gemm_dtype)
  flops = model_flops_per_token(a)
  rows = []
  passed = [
    f"--{k}={v}"
    for k, v in vars(a).items()
    if k
    in (
      "hidden",
      "layers",
      "heads",
      "kv_heads",
      "intermediate",
      "vocab",
      "seq_len",
      "batch_size",
      "steps",
      "rank",
      "dtype",
      "repeats",
    )
  ]
  passed += ["--remat"] if a.remat else []
  import jax

  platform = jax.devices()[0].platform
  for k in (int(v) for v in a.clients.split(",")):
    for side in a.frameworks.split(","):
      cmd = [sys.executable, "-m", "benchmarks.llm", f"--worker={side}", f"--k={k}", *passed]
      cmd += [f"--checkpoint={directory}"] if directory else []
      t = time.perf_counter()
      proc = subprocess.run(cmd, capture_output=True, text=True)
      line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
      if proc.returncode or not line:
        print(f"{side} K={k} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        continue
      r = json.loads(line[0][len("RESULT ") :])
      toks = k * a.steps * a.batch_size * a.seq_len
      r.update(
        framework=side,
        K=k,
        tokens=toks,
        tokens_per_s=toks / r["round_s"],
        MFU=toks * flops / r["round_s"] / (1e9 * r["peak_GFLOPs"]),
        wall_s=time.perf_counter() - t,
      )
      rows.append(r)
      print(
        f"{side:8s} K={k:3d} {r['tokens_per_s']:9.1f} tok/s  round {r['round_s']:7.2f} s  "
        f"peak RSS {r['peak_rss_MB']:8.1f} MB  MFU {100 * r['MFU']:5.1f} %",
        flush=True,
      )
  out = {
    "params": params,
    "platform": platform,
    "peak_GFLOPs": peak / 1e9,
    "model_flops_per_token": flops,
    "args": vars(a),
    "rows": rows,
  }
  with open(os.path.join(a.out_dir, f"{a.tag}.json"), "w") as f:
    json.dump(out, f, indent=1)
  print(table(out))
  return out


def table(out: dict) -> str:
  """The Markdown table of benchmarks/README.md."""
  by = {(r["framework"], r["K"]): r for r in out["rows"]}
  ks = sorted({r["K"] for r in out["rows"]})
  lines = [
    "| K | fedtree tok/s | torch+peft tok/s | ratio | fedtree peak RSS MB (compiled MB) | torch+peft peak "
    "RSS MB | fedtree MFU | torch+peft MFU |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for k in ks:
    f, t = by.get(("fedtree", k)), by.get(("torch", k))
    cell = lambda r, key, fmt: fmt.format(r[key]) if r else "-"  # noqa: E731
    ratio = f"{f['tokens_per_s'] / t['tokens_per_s']:.2f}x" if f and t else "-"
    mem = f"{f['peak_rss_MB']:.0f} ({f['compiled_MB']:.0f})" if f else "-"
    lines.append(
      f"| {k} | {cell(f, 'tokens_per_s', '{:.0f}')} | {cell(t, 'tokens_per_s', '{:.0f}')} | {ratio} | "
      f"{mem} | {cell(t, 'peak_rss_MB', '{:.0f}')} | {cell(f, 'MFU', '{:.1%}')} | "
      f"{cell(t, 'MFU', '{:.1%}')} |"
    )
  head = (
    f"{out['params'] / 1e6:.1f} M parameters, seq {out['args']['seq_len']}, measured peak "
    f"{out['peak_GFLOPs']:.1f} GFLOP/s ({out['args']['gemm_dtype']} GEMM {out['args']['gemm']}^2, "
    f"{out.get('platform', 'cpu')})"
  )
  return head + "\n\n" + "\n".join(lines)


if __name__ == "__main__":
  main()
