"""Width-scaled sub-models as masks over the full model's shapes: the channels of every layer a client
of width ``r`` holds (a prefix, HeteroFL's, or a rolling window, FedRolex's), the scaler, and the
clients' capacity levels (:doc:`the page <algorithms/heterogeneous.md>`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
_LAYER = re.compile(r"^(Conv|Dense)_(\d+)$")


class Layer(NamedTuple):
  """One layer of the chain: its name, its output channels and how its inputs follow the layer
  before (``repeat`` input rows per channel before it: a flatten's spatial positions, else 1)."""

  name: str
  width: int
  repeat: int
  first: bool
  last: bool
  fan_in: int    # the kernel's input rows
  window: int    # a convolution kernel's spatial size (1 for a dense layer)


class WidthPlan(NamedTuple):
  """The model's layers in order, and the channels each capacity level keeps of them."""

  layers: tuple[Layer, ...]

  def kept(self, rate: float) -> tuple[int, ...]:
    """Channels of every layer a client of ``rate`` holds (``ceil(rate · n)``; the last layer whole)."""
    return tuple(lay.width if lay.last else math.ceil(rate * lay.width) for lay in self.layers)

  def channel_masks(self, kept, offset=0, classes=None) -> list[jax.Array]:
    """Every layer's output-channel mask: channels ``offset, offset+1, ... (mod n)``, ``kept[l]`` of
    them (``kept`` and ``offset`` may be traced); the last layer's ``classes`` (``bool[K]``; ``None``:
    every class)."""
    out = []
    for lay, k in zip(self.layers, kept, strict=True):
      idx = jnp.arange(lay.width)
      if lay.last:
        out.append(jnp.ones((lay.width,), bool) if classes is None else jnp.asarray(classes, bool))
      else:
        out.append(((idx - offset) % lay.width) < k)
    return out

  def masks(self, template: PyTree, kept, offset=0, classes=None) -> PyTree:
    """``float`` masks shaped as ``template``: 1 on the coordinates the sub-model holds."""
    outs = self.channel_masks(kept, offset, classes)
    by_name = {}
    for i, lay in enumerate(self.layers):
      ins = None if lay.first else jnp.tile(outs[i - 1], lay.repeat)
      by_name[lay.name] = (ins, outs[i])

    def leaf(path, p):
      name, field = _names(path)[-2:]
      ins, outs_ = by_name[name]
      m = outs_ if field == "bias" or ins is None else ins[:, None] & outs_[None, :]
      return jnp.broadcast_to(m, np.shape(p)).astype(jnp.result_type(p))

    return jax.tree_util.tree_map_with_path(leaf, template)

  def scales(self, template: PyTree, rate) -> PyTree:
    """HeteroFL's scaler as a factor on the parameters: ``1 / rate`` on every layer but the last
    (a layer's output divided by the rate in training), 1 on the last."""
    last = {lay.name for lay in self.layers if lay.last}
    return jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.asarray(1.0 if _names(path)[-2] in last else 1.0 / rate, jnp.result_type(p)),
      template)

  def factors(self, template: PyTree, kept, rate, *, offset=0, scaler: bool = True,
              classes=None) -> tuple[PyTree, PyTree]:
    """``(mask, factors)``: a sub-model's mask, and what the full parameters are multiplied by to
    compute as it does (the mask, times the scaler's ``1 / rate`` with ``scaler``)."""
    mask = self.masks(template, kept, offset, classes)
    return mask, (jax.tree.map(jnp.multiply, mask, self.scales(template, rate)) if scaler else mask)

  def compute_share(self, rate: float) -> float:
    """The sub-model's multiply-adds over the full model's, from the kernels' kept rows and columns (exact
    for dense layers; a convolution's counted once per kernel, not per output position)."""
    kept, total, full = self.kept(rate), 0, 0
    for i, (lay, k) in enumerate(zip(self.layers, kept, strict=True)):
      rows = lay.fan_in if lay.first else kept[i - 1] * lay.repeat
      total += rows * lay.window * k
      full += lay.fan_in * lay.window * lay.width
    return total / full

  def parameters(self, rate: float) -> int:
    """Parameters of the sub-model of ``rate`` (what a client of that rate holds and sends)."""
    kept, total = self.kept(rate), 0
    for i, (lay, k) in enumerate(zip(self.layers, kept, strict=True)):
      rows = lay.fan_in if lay.first else kept[i - 1] * lay.repeat
      total += rows * lay.window * k + k
    return total


def _names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def width_plan(template: PyTree, algorithm: str) -> WidthPlan:
  """The chain of ``template``'s layers in order (convolutions, then dense layers).

  Raises:
    ValueError: a parameter outside a ``Conv_i``/``Dense_i`` layer's ``kernel`` and ``bias``, or layers
      whose shapes do not chain (named, with the model's layers).
  """
  leaves = jax.tree_util.tree_leaves_with_path(template)
  found: dict[str, dict[str, tuple[int, ...]]] = {}
  for path, p in leaves:
    names = _names(path)
    layer, field = (names[-2], names[-1]) if len(names) >= 2 else ("", names[-1])
    nested = len(names) > 2 and names[0] != "params"
    if not _LAYER.match(layer) or field not in ("kernel", "bias") or nested:
      raise ValueError(f"{algorithm} cannot slice the model's parameter {'/'.join(names)} (shape "
                       f"{tuple(np.shape(p))}): width scaling slices the output channels of a chain of "
                       f"Conv_i and Dense_i layers with a kernel and a bias (the mlp and cnn models, without "
                       f"BatchNorm or adapters)")
    found.setdefault(layer, {})[field] = tuple(np.shape(p))
  order = sorted(found, key=lambda n: (_LAYER.match(n).group(1) != "Conv", int(_LAYER.match(n).group(2))))
  layers: list[Layer] = []
  for i, name in enumerate(order):
    shapes = found[name]
    if set(shapes) != {"kernel", "bias"}:
      raise ValueError(f"{algorithm} cannot slice layer {name}: it has {sorted(shapes)}, not a kernel and a "
                       f"bias")
    kernel = shapes["kernel"]
    width, rows = kernel[-1], kernel[-2]
    repeat = 1
    if i:
      before = layers[-1].width
      if rows % before:
        raise ValueError(f"{algorithm} cannot slice layer {name}: its {rows} inputs are not a whole number "
                         f"of copies of the {before} channels of {order[i - 1]} (the layers in order: "
                         f"{order})")
      repeat = rows // before
    layers.append(Layer(name, int(width), int(repeat), i == 0, i == len(order) - 1, int(rows),
                        int(np.prod(kernel[:-2])) if len(kernel) > 2 else 1))
  if len(layers) < 2:
    raise ValueError(f"{algorithm} needs at least one hidden layer to slice; the model has {order}")
  return WidthPlan(tuple(layers))


def check_rates(rates: Sequence[float], proportions: Sequence[float] | None, algorithm: str
                ) -> tuple[np.ndarray, np.ndarray]:
  """``(rates, proportions)`` as arrays, checked: rates in (0, 1], distinct; proportions one per rate,
  non-negative, summing to 1 (``None``: equal).

  Raises:
    ValueError: naming the offending values and what is allowed.
  """
  r = np.asarray(rates, np.float64).ravel()
  if r.size == 0 or np.any(~np.isfinite(r)) or np.any(r <= 0) or np.any(r > 1):
    raise ValueError(f"{algorithm}: rates={r.tolist()} must be width ratios in (0, 1] (HeteroFL's a-e are "
                     f"1, 1/2, 1/4, 1/8, 1/16)")
  if len(set(r.tolist())) != r.size:
    raise ValueError(f"{algorithm}: rates={r.tolist()} repeats a rate; give each level once")
  if proportions is None:
    p = np.full(r.size, 1.0 / r.size)
  else:
    p = np.asarray(proportions, np.float64).ravel()
    if p.size != r.size or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-6:
      raise ValueError(f"{algorithm}: proportions={p.tolist()} must be {r.size} non-negative shares (one per "
                       f"rate {r.tolist()}) summing to 1; they sum to {p.sum():g}")
  return r, p


def client_levels(proportions: np.ndarray, num_clients: int, seed: int, *, sizes: np.ndarray | None = None,
                  speed: np.ndarray | None = None) -> np.ndarray:
  """``int32[C]``: every client's capacity level, fixed for the run: ``round(p · C)`` clients per level
  (largest remainders), placed by a seeded permutation; with ``speed`` (``[C]``, e.g. a systems profile's
  steps per second, FedScale's device traces) by it instead: the slowest clients get the levels of the
  smallest ``sizes`` (``[L]``, the levels' rates or depths), the fastest the largest (ties by client)."""
  exact = proportions * num_clients
  counts = np.floor(exact).astype(np.int64)
  short = num_clients - counts.sum()
  counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
  if speed is None:
    levels = np.repeat(np.arange(proportions.size), counts)
    return np.random.default_rng(seed).permutation(levels).astype(np.int32)
  by_size = np.argsort(np.asarray(sizes), kind="stable")
  out = np.empty(num_clients, np.int32)
  out[np.argsort(np.asarray(speed), kind="stable")] = np.repeat(by_size, counts[by_size])
  return out


def client_classes(data, algorithm: str) -> np.ndarray:
  """``bool[C, K]``: the classes present in every client's training rows (HeteroFL's ``label_split``).

  Raises:
    ValueError: a ragged training split, or labels that are not one class per example.
  """
  data = data.require_padded(f"{algorithm}'s label_split")
  y, n = np.asarray(data.y_train), np.asarray(data.n_train)
  if y.ndim != 2:
    raise ValueError(f"{algorithm}: label_split=True needs one class per example; the labels have shape "
                     f"{y.shape[2:]} per example")
  present = np.zeros((y.shape[0], int(data.num_classes)), bool)
  for c in range(y.shape[0]):
    present[c, y[c, : n[c]]] = True
  return present


def level_name(rate: float) -> str:
  """A level's model name: ``width_1``, ``width_1_2``, ``width_1_16``."""
  f = Fraction(float(rate)).limit_denominator(1000)
  return f"width_{f.numerator}" if f.denominator == 1 else f"width_{f.numerator}_{f.denominator}"
