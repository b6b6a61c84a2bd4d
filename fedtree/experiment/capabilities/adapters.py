"""The LoRA capability: a run's ``adapters`` section makes its model low-rank adapters on a frozen
base (:mod:`fedtree.toolbox.lora`): the run's ``init_params`` (e.g. a pretrained model), else
``model.init`` of the config's seed (stream ``"base"``).

Section (``config.runs.<label>.adapters``): ``{kind: "lora", rank: 8, alpha: 16.0, targets: (regex,
...), forward: "factored" | "merged", base_dtype: None | "float32" | "bfloat16" | "int8"}``;
``base_dtype`` is how the frozen base is stored (:func:`fedtree.toolbox.quantize.store_base`; ``None``:
as loaded; ``"int8"``: weight-only, per output channel, expanded to bfloat16 where it is used). An
algorithm takes it where its spec says so (``AlgorithmSpec(..., takes=("adapters",))``: FedAvg, FedOpt
(FedAvgM, FedAdam, FedYogi), HierFAVG, FedProx, SCAFFOLD, Ditto, GroupPerFL, and the methods defined on
adapters: FFA-LoRA, FedSA-LoRA, HetLoRA). Its in-jit half wraps the
algorithm (:func:`fedtree.toolbox.lora.frozen_base`: the base is an argument of every compiled round,
never a constant); its host half scores the adapters with the base as an argument
(:func:`fedtree.toolbox.lora.base_evaluator`), and a message is the adapters alone (the base is on every
client before round 0 and never sent).
"""

from __future__ import annotations

import sys

import jax

from fedtree.core.rng import stream
from fedtree.experiment.capability import Capability, RunContext, Wrapping, plain
from fedtree.experiment.fields import field
from fedtree.experiment.spec import check_fields
from fedtree.toolbox import lora
from fedtree.toolbox.quantize import BASE_DTYPES, store_base

KINDS = ("lora",)
FIELDS = ("kind", "rank", "alpha", "targets", "forward", "base_dtype")


def lora_spec(section, where: str) -> lora.LoRA:
  """The :class:`~fedtree.toolbox.lora.LoRA` spec of an ``adapters`` section (``where`` names it in
  errors)."""
  cfg = dict(plain(section))
  check_fields(where, list(cfg), FIELDS)
  cfg.pop("base_dtype", None)
  kind = cfg.pop("kind", "lora")
  if kind not in KINDS:
    raise ValueError(f"{where}.kind={kind!r}; choose one of {KINDS}")
  if "targets" in cfg and not isinstance(cfg["targets"], str):
    cfg["targets"] = tuple(cfg["targets"])
  try:
    return lora.lora(**cfg)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e


def adapters_from_config(label: str, run):
  """The :class:`~fedtree.toolbox.lora.LoRA` spec of ``config.runs.<label>.adapters`` (``None``
  without one)."""
  if "adapters" not in run or run.adapters is None:
    return None
  return lora_spec(run.adapters, f"config.runs.{label}.adapters")


def wrapping(section, ctx: RunContext) -> Wrapping:
  """The run's model as adapters on the frozen base (see the module docstring)."""
  where = f"config.runs.{ctx.label}.adapters"
  spec = lora_spec(section, where)
  base = ctx.initial_params(ctx.run, ctx.label)
  if base is None:
    base = ctx.model.init(stream(jax.random.key(int(field(ctx.config, "seed"))), "base"))
  base_dtype = plain(section).get("base_dtype", None)
  if base_dtype is not None and base_dtype not in BASE_DTYPES:
    raise ValueError(f"{where}.base_dtype={base_dtype!r}; choose one of {BASE_DTYPES} (or None: as loaded)")
  try:
    targets = lora.lora_targets(spec, base)
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from e
  base = store_base(base, base_dtype)
  full = lora.full_rank_kernels(spec, targets)
  if full:
    print(f"warning: {where}: rank={spec.rank} exceeds the smaller side of {full}: their adapters hold "
          f"more parameters than the kernels and are no low-rank update (lower the rank, or targets that "
          f"leave them out)", file=sys.stderr, flush=True)
  model = ctx.model

  def build(make):
    return lora.frozen_base(make, model=model, spec=spec, base=base)

  def evaluator(chunk_size, *, confusion: bool, **scoring):
    evaluator_for = lora.base_evaluator(model, spec, chunk_size, confusion=confusion, **scoring)
    return lambda state: evaluator_for(state.base)

  def forward(bound, tokens):   # bound = (base, adapters): the base is an argument of the program
    return lora.adapted_model(model, spec, bound[0]).apply(bound[1], tokens)

  def bind(state):
    return lambda params: (state.base, params)

  shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), base)
  return Wrapping(model=lora.adapted_model(model, spec, shapes), build=build, evaluator=evaluator,
                  forward=(forward, bind))


CAPABILITY = Capability(name="adapters", about="LoRA adapters on a frozen base", wrap=wrapping)
"""The ``adapters`` section (see the module docstring)."""
