"""Low-rank adapters (LoRA; Hu et al. 2022, "LoRA: Low-rank adaptation of large language
models") on a frozen base model that is shared, never stacked, by every client and node.

A :class:`LoRA` spec (rank ``r``, scaling ``alpha``, ``targets``: regular expressions over the
``/``-joined parameter paths, e.g. ``attn0/query/kernel``, ``lstm1/w_h``) selects kernels ``W``
(floating parameters with at least 2 axes) of a base model; each gets a pair ``A [d_in, r]``
(random) and ``B [r, d_out]`` (zero), and the adapted kernel is ``W + (alpha / r) A B``. A kernel
with more than 2 axes is a matrix split between its axes where the two sides are closest in
size (attention's ``query [d, h, k]`` as ``[d, h·k]``, its ``out [h, k, d]`` as ``[h·k, d]``).

Two forwards compute the same function (``LoRA.forward``):

* ``"factored"`` (the default): a kernel used by a flax ``nn.Dense``, or an ``nn.DenseGeneral``
  contracting the trailing axes its matrix split names (attention's query/key/value/out), is
  left as the base's and the layer's output gets ``(alpha / r) (x A) B`` added (a flax method
  interceptor, :func:`flax.linen.intercept_methods`). Under ``vmap`` over clients the base
  product ``x W`` is then one matmul for the whole chunk against the one shared ``W``, and
  the backward pass never forms a ``[d_in, d_out]`` gradient per client: cheaper and smaller.
  Kernels used any other way (the LSTM's ``w_x``/``w_h``, :class:`fedtree.models.Conv`) are
  merged, as below.
* ``"merged"``: every adapted kernel is replaced by ``W + (alpha / r) A B`` before the model
  runs (:func:`merge`): per client, a full kernel and its full gradient.

:func:`adapted_model` turns a :class:`~fedtree.core.model.Model` and its base parameters into a
Model whose parameters are the adapters only: ``init(key)`` returns fresh adapters (B = 0, so
the adapted model starts equal to the base) and ``apply(adapters, x)`` runs the base with the
adapters merged in. Every algorithm that takes a ``model`` then trains, stacks, sends and
aggregates adapters as its "params", unchanged: one global adapter (FedAvg/FedOpt/HierFAVG),
one per group (GroupPerFL's group stage), one per client (Ditto's personal models, GroupPerFL's
fine-tuning), and the local step differentiates the adapters alone.

The base must reach compiled programs as an *argument*. JAX 0.10 embeds an array that a jitted
function closes over as a literal of the program (a 16 MB kernel is 32 MB of HLO text and a
second copy held by the executable; measured in ``benchmarks/README.md``), and a round closes
over its model. :func:`frozen_base` therefore wraps an algorithm: its state is
:class:`FrozenBaseState` ``(base, inner)``, the base one unstacked copy beside the wrapped
algorithm's state, and each round binds the model to the base it receives (a tracer) and
builds the wrapped algorithm on it while tracing (factories are cheap host code, run once per
compilation). :func:`base_evaluator` scores the adapters the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedtree.core.algorithm import FederatedAlgorithm
from fedtree.core.metrics import make_evaluator
from fedtree.core.model import Model, param_paths  # noqa: F401  (re-exported: the adapters' paths)
from fedtree.toolbox.quantize import dequantize, dequantized_shapes

PyTree = Any

FORWARDS = ("factored", "merged")
"""How an adapted model computes its outputs (:class:`LoRA` ``forward``)."""

DEFAULT_TARGETS = (r"kernel$|(^|/)w_[xh]$",)
"""Every flax ``Dense``/``DenseGeneral``/attention/conv ``kernel`` and the LSTM's input and
recurrent matrices (:class:`fedtree.models.lm.LSTMLayer`)."""


class LoRA(NamedTuple):
  """Which kernels get adapters and their shape.

  Attributes:
    rank: ``r >= 1``, the inner dimension of ``A [d_in, r]`` and ``B [r, d_out]``.
    alpha: the scaling numerator: the update is ``(alpha / r) A B``.
    targets: regular expressions searched (:func:`re.search`) in every ``/``-joined parameter
      path; a kernel matched by any of them is adapted.
    forward: one of :data:`FORWARDS` (the module docstring): the same function, computed
      factored (``x W + (alpha/r) (x A) B`` where a flax dense layer uses the kernel) or merged.
  """

  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = DEFAULT_TARGETS
  forward: str = "factored"

  @property
  def scale(self) -> float:
    return float(self.alpha) / int(self.rank)


def lora(*, rank: int = 8, alpha: float = 16.0, targets: str | Sequence[str] = DEFAULT_TARGETS,
         forward: str = "factored") -> LoRA:
  """A validated :class:`LoRA` spec (``targets``: one pattern or several).

  Raises:
    ValueError: ``rank < 1``, ``alpha`` not a positive finite number, no target, a target
      that is not a regular expression, or ``forward`` not one of :data:`FORWARDS`.
  """
  if forward not in FORWARDS:
    raise ValueError(f"LoRA forward={forward!r}; choose one of {FORWARDS}")
  if isinstance(rank, bool) or int(rank) != rank or int(rank) < 1:
    raise ValueError(f"LoRA rank={rank!r} must be an integer >= 1")
  if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
    raise ValueError(f"LoRA alpha={alpha!r} must be a finite number > 0")
  targets = (targets,) if isinstance(targets, str) else tuple(targets)
  if not targets:
    raise ValueError("LoRA targets=() selects no kernel; give at least one pattern, e.g. 'kernel$'")
  for t in targets:
    try:
      re.compile(t)
    except (re.error, TypeError) as e:
      raise ValueError(f"LoRA target {t!r} is not a regular expression: {e}") from e
  return LoRA(rank=int(rank), alpha=float(alpha), targets=tuple(str(t) for t in targets),
              forward=str(forward))


# ------------------------------------------------------------------------ paths and targets
def _is_kernel(leaf) -> bool:
  return len(np.shape(leaf)) >= 2 and jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def matrix_split(shape: Sequence[int]) -> int:
  """The number of leading (input) axes of a kernel of ``shape`` seen as a matrix: the split
  whose two sides are closest in size (ties: fewer input axes); 1 for a 2-D kernel."""
  shape = tuple(int(s) for s in shape)
  sides = [abs(math.prod(shape[:k]) - math.prod(shape[k:])) for k in range(1, len(shape))]
  return 1 + int(np.argmin(sides))


def lora_targets(spec: LoRA, params: PyTree) -> dict[str, tuple[int, int]]:
  """``{path: (d_in, d_out)}`` of every kernel of ``params`` that ``spec`` adapts.

  Raises:
    ValueError: the model has no kernel at all, or a pattern of ``spec.targets`` matches none
      of its kernels (the message names the pattern and lists the parameter paths), or
      ``spec.rank`` exceeds the smaller side of every adapted kernel (of some:
      :func:`full_rank_kernels`, which the experiment layer names in a warning).
  """
  leaves = [(jax.tree_util.keystr(p, simple=True, separator="/"), leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
  kernels = {path: np.shape(leaf) for path, leaf in leaves if _is_kernel(leaf)}
  if not kernels:
    raise ValueError(
      f"LoRA targets {list(spec.targets)}: the model has no kernel (floating parameter with >= 2 "
      f"axes) to adapt; its parameters are {[f'{p} {tuple(np.shape(v))}' for p, v in leaves]}")
  listing = [f"{p} {tuple(s)}" for p, s in kernels.items()]
  out: dict[str, tuple[int, int]] = {}
  for pattern in spec.targets:
    hits = [p for p in kernels if re.search(pattern, p)]
    if not hits:
      others = [p for p, _ in leaves if p not in kernels and re.search(pattern, p)]
      also = f" (it matches only non-kernel parameters {others})" if others else ""
      raise ValueError(f"LoRA target {pattern!r} matches no kernel of the model{also}; its kernels "
                       f"are {listing}")
    for p in hits:
      shape = kernels[p]
      k = matrix_split(shape)
      out[p] = (math.prod(shape[:k]), math.prod(shape[k:]))
  if all(spec.rank > min(s) for s in out.values()):
    p, (d_in, d_out) = max(out.items(), key=lambda kv: min(kv[1]))
    raise ValueError(
      f"LoRA rank={spec.rank} exceeds the smaller side of every adapted kernel (the largest: {p}, {d_in} x "
      f"{d_out}): no adapter is a low-rank update (A [{d_in}, {spec.rank}] B [{spec.rank}, {d_out}] has more "
      f"parameters than the kernel and rank {min(d_in, d_out)} at most); choose rank <= {min(d_in, d_out)}")
  return out


def full_rank_kernels(spec: LoRA, targets: dict[str, tuple[int, int]]) -> list[str]:
  """The kernels of ``targets`` (:func:`lora_targets`) whose smaller side ``spec.rank`` exceeds:
  their adapters are no low-rank update (more parameters than the kernel)."""
  return sorted(p for p, s in targets.items() if spec.rank > min(s))


# ------------------------------------------------------------------------ adapters
def init_adapters(spec: LoRA, params: PyTree, key: jax.Array) -> PyTree:
  """Fresh adapters for ``params``: a nested dict mirroring the parameters' nesting, with
  ``{"a": A [d_in, r], "b": B [r, d_out]}`` in place of every adapted kernel and nothing
  elsewhere. ``A ~ N(0, 1/d_in)``, ``B = 0`` (so the adapted model starts as the base); the
  kernel's dtype, at least float32 (a bfloat16 or int8 base gets float32 masters: the forward
  casts them to the compute dtype, the optimizer updates them in float32). Only shapes of
  ``params`` are read (abstract values work)."""
  targets = lora_targets(spec, params)
  dtypes = {jax.tree_util.keystr(p, simple=True, separator="/"): jnp.result_type(leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  out: dict = {}
  for i, (path, (d_in, d_out)) in enumerate(sorted(targets.items())):
    node = out
    *parents, last = path.split("/")
    for name in parents:
      node = node.setdefault(name, {})
    dtype = jnp.promote_types(dtypes[path], jnp.float32)
    a = jax.random.normal(jax.random.fold_in(key, i), (d_in, spec.rank), dtype) / math.sqrt(d_in)
    node[last] = {"a": a, "b": jnp.zeros((spec.rank, d_out), dtype)}
  return out


def _is_pair(node) -> bool:
  return isinstance(node, dict) and set(node) <= {"a", "b"} and bool(node)


def adapter_half(adapters: PyTree, half: str) -> PyTree:
  """The ``"a"`` or ``"b"`` matrices of ``adapters`` in the same nesting (``{..., "kernel": {"b": B}}``
  for ``half="b"``): what a method trains or shares when the other half is frozen or kept."""
  if half not in ("a", "b"):
    raise ValueError(f"adapter half={half!r}; choose 'a' or 'b'")
  if _is_pair(adapters):
    return {half: adapters[half]} if half in adapters else {}
  if isinstance(adapters, dict):
    out = {k: adapter_half(v, half) for k, v in adapters.items()}
    return {k: v for k, v in out.items() if v != {}}
  raise ValueError(f"not LoRA adapters (a nested dict of {{'a': A, 'b': B}} pairs): found "
                   f"{type(adapters).__name__}")


def join_halves(a: PyTree, b: PyTree) -> PyTree:
  """Adapters from their two halves (:func:`adapter_half`), e.g. a frozen ``A`` and a trained ``B``."""
  if _is_pair(a) or _is_pair(b):
    return {**a, **b}
  return {k: join_halves(a.get(k, {}), b.get(k, {})) for k in sorted(set(a) | set(b))}


def check_adapters(params: PyTree, algorithm: str) -> None:
  """Refuses ``params`` that are not LoRA adapters (every leaf under a ``{"a": A, "b": B}`` pair),
  naming ``algorithm``: a method defined on adapters needs a run with an ``adapters`` section.

  Raises:
    ValueError: a leaf whose path does not end in ``/a`` or ``/b``, or a pair without both halves.
  """
  paths = param_paths(params)
  bad = [p for p in paths if not re.search(r"(^|/)(a|b)$", p)]
  pairs = {p.rsplit("/", 1)[0] for p in paths} if not bad else set()
  unpaired = sorted(q for q in pairs if f"{q}/a" not in paths or f"{q}/b" not in paths)
  if bad or unpaired or not paths:
    raise ValueError(f"{algorithm} trains LoRA adapters: give the run an adapters section (config.runs."
                     f"<label>.adapters, or fedtree.toolbox.lora.frozen_base); the model's parameters are "
                     f"{(bad or unpaired or paths)[:6]}")


def adapter_rank(params: PyTree) -> int:
  """The rank ``r`` of adapters (``A [d_in, r]``; abstract values work)."""
  a = jax.tree.leaves(adapter_half(params, "a"))
  return int(np.shape(a[0])[-1])


def truncate(adapters: PyTree, rank: jax.Array) -> PyTree:
  """``adapters`` with every rank component ``j >= rank`` zeroed (``A[:, j]`` and ``B[j, :]``): the
  rank-``rank`` adapters a client of HetLoRA holds, zero-padded to the full rank. A component that is
  zero in both halves gets zero gradients and stays zero under any optimizer without decay towards a
  nonzero value. ``rank`` may be traced."""

  def pair(node):
    if _is_pair(node):
      r = node["a"].shape[-1]
      keep = jnp.arange(r) < rank
      return {"a": jnp.where(keep[None, :], node["a"], 0).astype(node["a"].dtype),
              "b": jnp.where(keep[:, None], node["b"], 0).astype(node["b"].dtype)}
    return {k: pair(v) for k, v in node.items()}

  return pair(adapters)


def _adapter_of(adapters: PyTree, path: str):
  node = adapters
  for name in path.split("/"):
    if not isinstance(node, dict) or name not in node:
      return None
    node = node[name]
  return node


def merge(spec: LoRA, params: PyTree, adapters: PyTree, *, skip: frozenset[str] = frozenset()) -> PyTree:
  """``params`` with every adapted kernel replaced by ``W + (alpha / r) A B`` (the kernel's
  shape and dtype): the full model the adapters define. Merging zero-B adapters returns the
  base's values. Kernels whose path is in ``skip`` are left as they are (the factored
  forward adds their adapters to the layers' outputs instead)."""

  def one(path, w):
    if isinstance(w, jax.ShapeDtypeStruct):   # an abstract base (frozen_base's template), traced
      w = jnp.zeros(w.shape, w.dtype)
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    pair = None if name in skip else _adapter_of(adapters, name)
    if pair is None:
      return w
    delta = (pair["a"] @ pair["b"]) * jnp.asarray(spec.scale, pair["a"].dtype)
    return w + delta.reshape(w.shape).astype(w.dtype)

  return jax.tree_util.tree_map_with_path(one, params)


def adapter_count(adapters: PyTree) -> int:
  """Number of adapter parameters (what a client trains and sends)."""
  return int(sum(np.prod(np.shape(a)) for a in jax.tree.leaves(adapters)))


def _dense_inputs(module: nn.Module, ndim: int) -> int | None:
  """How many trailing input axes ``module``'s ``__call__`` contracts with its ``kernel``
  (``x[..., in...] · kernel[in..., out...]``), or ``None`` where it is not such a layer."""
  if isinstance(module, nn.Dense):
    return 1
  if isinstance(module, nn.DenseGeneral) and not module.batch_dims:
    axis = module.axis if isinstance(module.axis, tuple) else (module.axis,)
    axis = tuple(sorted(a % ndim for a in axis))
    if axis == tuple(range(ndim - len(axis), ndim)):
      return len(axis)
  return None


def _kernel_path(module: nn.Module) -> str:
  return "/".join((*module.path, "kernel"))


def _struct(a) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a))


def factored_kernels(model: Model, spec: LoRA, base: PyTree, x: jax.Array, *,
                     train: bool = False, rng: jax.Array | None = None) -> dict[str, int]:
  """``{path: input axes}`` of the adapted kernels that the factored forward adds to layer
  outputs for inputs like ``x``: those every call of a flax ``nn.Dense``/``nn.DenseGeneral``
  uses as ``x[..., in...] · W[in..., out...]`` with ``in`` the kernel's matrix split
  (:func:`matrix_split`) and the kernel unchanged in shape. The model is traced abstractly
  (:func:`jax.eval_shape`); nothing runs."""
  targets = lora_targets(spec, base)
  shapes = {p: tuple(np.shape(leaf)) for p, leaf in
            ((jax.tree_util.keystr(k, simple=True, separator="/"), leaf)
             for k, leaf in jax.tree_util.tree_flatten_with_path(base)[0])}
  seen: dict[str, int | None] = {}

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name != "__call__" or not args or _kernel_path(context.module) not in targets:
      return out
    path, inputs = _kernel_path(context.module), args[0]
    n_in = _dense_inputs(context.module, inputs.ndim)
    lead = inputs.ndim - (n_in or 0)
    ok = (n_in is not None and matrix_split(shapes[path]) == n_in
          and tuple(inputs.shape[lead:]) + tuple(out.shape[lead:]) == shapes[path])
    seen[path] = n_in if ok and seen.get(path, n_in) == n_in else None
    return out

  def run(b, xx, key):
    with nn.intercept_methods(record):
      return model.apply(b, xx, train=train, rng=key)

  jax.eval_shape(run, jax.tree.map(_struct, base), _struct(x), None if rng is None else _struct(rng))
  return {p: n for p, n in seen.items() if n is not None}


def adapted_model(model: Model, spec: LoRA, base: PyTree) -> Model:
  """``model`` whose parameters are LoRA adapters on the frozen ``base``.

  ``init(key)`` returns fresh adapters (:func:`init_adapters`); ``apply(adapters, x, train=,
  rng=)`` is the base model with the adapters applied, factored or merged as ``spec.forward``
  says (the module docstring; both compute ``model.apply(merge(spec, base, adapters), x, ...)``).
  Gradients of a loss of ``apply`` with respect to its parameters are gradients of the
  adapters only: the base is a constant of the function. Inside a jitted round ``base`` should
  be the round's argument (a tracer; see :func:`frozen_base`), so that it is not embedded in
  the program.

  A base stored quantized (:func:`fedtree.toolbox.quantize.store_base`, ``"int8"``) is expanded
  where the model uses it (:func:`fedtree.toolbox.quantize.dequantize`), inside the forward.

  Raises:
    ValueError: as :func:`lora_targets` (checked now, before anything compiles), or a model with
      state (BatchNorm statistics: adapters on such a model are not supported).
  """
  if model.state:
    raise ValueError(f"LoRA adapters on a model with state {list(model.state)} (BatchNorm statistics) are "
                     f"not supported: train the full model, or use a model without BatchNorm")
  view = dequantized_shapes(base)      # the base as the model sees it, shapes only
  lora_targets(spec, view)
  plans: dict[tuple, dict[str, int]] = {}    # input shape -> factored kernels; host-side, per trace

  def init(key):
    return init_adapters(spec, view, key)

  def apply(adapters, x, *, train: bool = False, rng: jax.Array | None = None):
    full = dequantize(base)
    if spec.forward == "merged":
      return model.apply(merge(spec, full, adapters), x, train=train, rng=rng)
    key = (tuple(np.shape(x)), str(jnp.result_type(x)), bool(train), rng is None)
    if key not in plans:
      plans[key] = factored_kernels(model, spec, view, x, train=train, rng=rng)
    factored = plans[key]

    def add_adapter(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if context.method_name != "__call__" or _kernel_path(context.module) not in factored:
        return out
      path = _kernel_path(context.module)
      pair = _adapter_of(adapters, path)
      inputs = args[0]
      n_in = factored[path]
      flat = inputs.reshape(inputs.shape[:inputs.ndim - n_in] + (-1,)).astype(out.dtype)
      low = (flat @ pair["a"].astype(out.dtype)) @ pair["b"].astype(out.dtype)
      return out + (low * jnp.asarray(spec.scale, out.dtype)).reshape(out.shape)

    params = merge(spec, full, adapters, skip=frozenset(factored))
    with nn.intercept_methods(add_adapter):
      return model.apply(params, x, train=train, rng=rng)

  return model._replace(init=init, apply=apply)


# ------------------------------------------------------------------------ the frozen base in a run
@struct.dataclass
class FrozenBaseState:
  """State of an algorithm whose model is adapters on a frozen base (:func:`frozen_base`).

  Attributes:
    base: the frozen base parameters, one copy (no client or node axis); never updated.
    inner: the wrapped algorithm's state, whose models (stacked ``[N, ...]`` per node,
      ``[C, ...]`` per client) are adapters.
  """

  base: PyTree
  inner: Any

  @property
  def round(self) -> jax.Array:
    """``int32[]`` rounds completed (the wrapped state's)."""
    return self.inner.round


def frozen_base(
  build: Callable[[Model], FederatedAlgorithm], *, model: Model, spec: LoRA, base: PyTree,
) -> FederatedAlgorithm:
  """The algorithm ``build(adapted_model(model, spec, base))`` with ``base`` passed to its
  compiled rounds as state (:class:`FrozenBaseState`) instead of baked into them.

  Args:
    build: ``build(model) -> FederatedAlgorithm``, e.g. ``lambda m: fedavg(model=m, ...)``;
      called once here (validation happens now) and once per trace of ``round``.
    model: the base model (parameters = the full model).
    spec: the adapters (:func:`lora`).
    base: the base parameters (e.g. a pretrained model), shared by every node and client.

  Returns:
    The wrapped algorithm: ``init``, ``round``, ``models`` (the adapters of every node and
    client, as the wrapped algorithm names them; score them with :func:`base_evaluator`),
    ``report`` (the wrapped one's, run on the host with the base bound as a constant),
    ``name`` and ``rounds`` as the wrapped algorithm's.

  Example:
    FedAvg of rank-2 adapters on a frozen MLP, one round:

    >>> from fedtree.algorithms import fedavg
    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(16,))
    >>> base = model.init(jax.random.key(0))
    >>> alg = frozen_base(lambda m: fedavg(model=m, data=data, local_optimizer=optax.sgd(0.1),
    ...                                    schedule=LocalSchedule(batch_size=8, steps=2)),
    ...                   model=model, spec=lora(rank=2), base=base)
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(1))
    >>> param_paths(alg.models(state)["global"].params)
    ['Dense_0/kernel/a', 'Dense_0/kernel/b', 'Dense_1/kernel/a', 'Dense_1/kernel/b']
  """
  # The template (validation, ``init``, ``models``, name) sees the base's shapes only, so that
  # nothing but the state holds the base's arrays.
  shapes = jax.tree.map(_struct, base)
  template = build(adapted_model(model, spec, shapes))

  def on(b) -> FederatedAlgorithm:
    # ``build`` runs again inside the trace of ``round``: its host-side work (a systems profile
    # drawn with numpy, the attackers' mask, samplers) must stay concrete, as it was for the
    # template; only what reads the traced base is traced
    with jax.ensure_compile_time_eval():
      return build(adapted_model(model, spec, b))

  def init(key):
    # a copy: the round loop donates the state's buffers, which must not delete the caller's base
    return FrozenBaseState(base=jax.tree.map(lambda a: jnp.array(a, copy=True), base),
                           inner=template.init(key))

  def round_fn(state: FrozenBaseState, data, key):
    inner, metrics = on(state.base).round(state.inner, data, key)
    return FrozenBaseState(base=state.base, inner=inner), metrics

  def models(state: FrozenBaseState):
    return template.models(state.inner)

  def report(state: FrozenBaseState, data, key, summaries):
    inner_report = on(state.base).report
    assert inner_report is not None  # only offered when the template has one
    return inner_report(state.inner, data, key, summaries)

  return FederatedAlgorithm(init=init, round=round_fn, models=models, name=template.name,
                            report=report if template.report is not None else None,
                            rounds=template.rounds)


def base_evaluator(model: Model, spec: LoRA, chunk_size: int | None = None, *, confusion: bool = False,
                   **options):
  """``evaluator_for(base) -> evaluator``: :func:`fedtree.core.metrics.make_evaluator` of the
  adapted model (with ``options``, e.g. ``top_k``) with ``base`` an argument of one compiled
  program (compiled once, whatever base it is given), so that evaluating adapters never embeds
  the base as a constant."""

  @jax.jit
  def run(base, params, x, y, n, moc):
    return make_evaluator(adapted_model(model, spec, base), chunk_size, confusion=confusion, **options)(
      params, x, y, n, moc)

  def evaluator_for(base):
    return lambda params, x, y, n, moc: run(base, params, x, y, n, moc)

  return evaluator_for
