"""``config.data`` -> ``(data, group labels, central test)``: the config side of :mod:`fedtree.datasets`.

:func:`load_with_info` also returns a :class:`DataInfo`, what a loader knows besides the
arrays (group names, the vocabulary of a text dataset), and :func:`model_options` uses it to
complete ``config.model`` (the character table of ``lstm_lm``'s ``embedding="chars"``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from fedtree.core.data import FederatedData
from fedtree.datasets import synthetic
from fedtree.datasets.synthetic import grouped_synthetic, synthetic_alpha_beta

TEXT_DATASETS = ("stdlib_text", "text_dir", "tfds_text", "leaf", "tff_h5")
DATASETS = ("grouped_synthetic", "synthetic", "tfds", "prototype_images", "sklearn_digits",
            "synthetic_kws", "speech_commands", "arrays", "hf", "instructions", "store") + TEXT_DATASETS


@dataclasses.dataclass(frozen=True)
class DataInfo:
  """What a loader knows besides the arrays.

  Attributes:
    group_names: the name of every group (``groups == g`` is group ``group_names[g]``), or
      ``None`` when the data names none.
    vocab: the token of every id of a text dataset (ids 0-3 the special tokens of
      :class:`fedtree.datasets.text.Vocabulary`), else ``None``.
    label_columns: ``int32[L, C]`` group labels of every client, coarsest first, when the data
      name a tree deeper than root -> groups -> clients (``config.topology.kind="columns"``
      builds it with :meth:`fedtree.core.topology.Topology.from_label_columns`); else ``None``.
    central: ``(x, y)`` of a central test set a natural split ships apart from its clients (TFF
      CIFAR-100's test clients), else ``None``.
    store: the :class:`~fedtree.population.store.ClientStore` the population is read from
      (``config.data.name="store"``; the data is then its :func:`fedtree.population.stream.skeleton`
      until the run decides to hold it resident), else ``None``.
    label_kind: ``"class"``, ``"tokens"`` or ``"multi_hot"`` (multi-hot labels ``[K]``: the model
      scores them with the sigmoid cross-entropy, :func:`fedtree.core.model.as_multi_label`).
  """

  group_names: tuple[str, ...] | None = None
  vocab: tuple[str, ...] | None = None
  label_columns: np.ndarray | None = None
  central: tuple[np.ndarray, np.ndarray] | None = None
  store: Any = None
  label_kind: str = "class"

  def char_table(self, max_chars: int = 16) -> np.ndarray:
    """``int32[V, max_chars]`` spelling of every vocabulary token
    (:meth:`fedtree.datasets.text.Vocabulary.char_table`).

    Raises:
      ValueError: the data has no vocabulary.
    """
    if self.vocab is None:
      raise ValueError("this data has no vocabulary, so no character table; embedding='chars' needs a "
                       f"text dataset (config.data.name one of {TEXT_DATASETS})")
    from fedtree.datasets.text import Vocabulary

    return Vocabulary(self.vocab).char_table(max_chars)


def load(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any]:
  """``(data, group labels [C], central test (x, y) or None)`` from ``config.data``
  (:func:`load_with_info` without the info)."""
  return load_with_info(cfg)[:3]


def load_with_info(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any, DataInfo]:
  """``(data, group labels [C], central test (x, y) or None, DataInfo)`` from ``config.data``;
  with a ``cfg.transform`` (``{kind, num_transformed, seed}``, see
  :func:`fedtree.datasets.transforms.transform_random_clients`) that many random clients'
  inputs are flipped or rotated, and the groups become 0 (unchanged) / 1 (transformed).
  ``cfg.layout``: ``"padded"`` (default) or ``"ragged"``, the training split stored flat with
  offsets (:func:`fedtree.core.ragged.to_ragged_train`) for long-tailed natural splits."""
  layout = cfg.get("layout", "padded")
  if layout not in LAYOUTS:
    raise ValueError(f"config.data.layout={layout!r}; choose one of {LAYOUTS}")
  transform = cfg.get("transform", None)
  cfg = ml_collections.ConfigDict({k: v for k, v in cfg.items() if k not in ("transform", "layout")})
  data, groups, central, info = _load(cfg)
  if transform is not None:
    from fedtree.datasets.transforms import transform_random_clients

    data, groups = transform_random_clients(data, **{k: _plain(v) for k, v in transform.items()})
    info = dataclasses.replace(info, group_names=("unchanged", "transformed"))
  if layout == "ragged":
    from fedtree.core.ragged import to_ragged_train

    data = to_ragged_train(data)
  return data, groups, central, info


LAYOUTS = ("padded", "ragged")


def model_options(model_cfg: dict[str, Any], info: DataInfo) -> dict[str, Any]:
  """``config.model``'s fields completed from the data: ``lstm_lm`` with
  ``embedding="chars"`` and no ``char_ids`` gets the character table of the data's vocabulary
  (``char_len`` characters per word, default 16; :meth:`DataInfo.char_table`).

  Raises:
    ValueError: ``embedding="chars"`` on data without a vocabulary.
  """
  out = dict(model_cfg)
  if out.get("name") == "lstm_lm" and out.get("embedding") == "chars" and out.get("char_ids") is None:
    out["char_ids"] = info.char_table(int(out.pop("char_len", 16)))
  return out


def _load(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any, DataInfo]:
  """``(data, group labels [C], central test (x, y) or None, info)`` from ``config.data``.

  ``cfg.name`` picks the dataset; the other fields are its keyword arguments.
  ``synthetic`` (FedProx/pFedMe) forms groups of ``cfg.team_size`` consecutive clients
  (pFedMT's teams) when given, else one group; so does ``sklearn_digits``
  (:func:`fedtree.datasets.digits.sklearn_digits`, scikit-learn's real 8x8 digits), which also
  takes ``cfg.num_groups`` (that many groups of consecutive clients). ``tfds`` reads the TFDS
  dataset named by ``cfg.dataset`` (the other fields are :func:`fedtree.datasets.tfds_loader.load_tfds`'s).
  """
  kwargs = {k: _plain(v) for k, v in cfg.items() if k not in ("name", "team_size")}
  name = cfg.name
  if name == "instructions":   # a pretrained model's instruction or chat data (fedtree.experiment.llm)
    from fedtree.experiment.llm import load_instruction_data

    data, groups, central, extras = load_instruction_data(kwargs)
    return data, groups, central, DataInfo()
  if name == "grouped_synthetic":
    data, groups = grouped_synthetic(**kwargs)
    return data, groups, None, DataInfo()
  if name == "synthetic":
    data = synthetic_alpha_beta(**kwargs)
    team = cfg.get("team_size", None)
    groups = np.arange(data.num_clients) // int(team) if team else np.zeros(data.num_clients, np.int32)
    return data, groups.astype(np.int32), None, DataInfo()
  if name == "prototype_images":
    from fedtree.datasets.prototypes import prototype_images

    data = prototype_images(**kwargs)
    kind = "multi_hot" if kwargs.get("max_labels") is not None else "class"
    return data, np.zeros(data.num_clients, np.int32), None, DataInfo(label_kind=kind)
  if name == "sklearn_digits":
    from fedtree.datasets.digits import sklearn_digits

    num_groups = kwargs.pop("num_groups", None)
    data = sklearn_digits(**kwargs)
    groups = consecutive_groups(data.num_clients, cfg.get("team_size", None), num_groups)
    return data, groups, None, DataInfo()
  if name == "tfds":
    from fedtree.datasets.tfds_loader import load_tfds

    kwargs["name"] = kwargs.pop("dataset", "mnist")
    return (*load_tfds(team_size=cfg.get("team_size", None), **kwargs), DataInfo())
  if name == "synthetic_kws":
    from fedtree.datasets.synthetic_kws import synthetic_kws

    data = synthetic_kws(**kwargs)
    return data, np.zeros(data.num_clients, np.int32), None, DataInfo()
  if name == "speech_commands":
    from fedtree.datasets.speech_commands import load_speech_commands

    return (*load_speech_commands(**kwargs), DataInfo())
  if name == "arrays":
    from fedtree.datasets.arrays import load_arrays

    team, num_groups = cfg.get("team_size", None), kwargs.pop("num_groups", None)
    data, groups, extras = load_arrays(**kwargs)
    return data, _file_groups(groups, data.num_clients, team, num_groups), None, _info(extras)
  if name == "hf":
    from fedtree.datasets.hf import load_hf

    team, num_groups = cfg.get("team_size", None), kwargs.pop("num_groups", None)
    data, groups, central, extras = load_hf(**kwargs)
    return data, _file_groups(groups, data.num_clients, team, num_groups), central, _info(extras)
  if name in TEXT_DATASETS:
    data, groups, info = load_natural(name, **kwargs)
    return data, groups, info.central, info
  if name == "store":
    return load_store(**kwargs)
  if name == "flair":   # pfl-research's HDF5 file: read through a store (fedtree.convert), never whole
    raise ValueError(f"FLAIR (pfl-research's HDF5 file, config.data.path={kwargs.get('path')!r}) streams "
                     "from a store, which is not prepared: convert it once (python -m fedtree.convert "
                     "--config=FILE --out=DIR, FILE the config whose data block names it) and run the config "
                     "with config.data.name='store' (a benchmark's :store variant), --config.data.path=DIR")
  raise ValueError(f"config.data.name={name!r} is unknown; choose one of {DATASETS}")


class PlannedSize(NamedTuple):
  """The clients' data a generated dataset's config will make, known before any array is
  (:func:`planned_size`).

  Attributes:
    bytes: a lower bound of the bytes of the data (:func:`fedtree.experiment.memory.tree_bytes` of it):
      exact but for the padded length, which is the longest client's.
    clients: the clients.
    how: how it is counted (examples x feature bytes), for a refusal.
  """

  bytes: int
  clients: int
  how: str


SURE = 1e-9
"""The chance that :func:`planned_size`'s padded length is larger than the data's own."""


def _max_draw(clients: int, mu: float, sigma: float, lo: float, hi: float) -> float:
  """A value the largest of ``clients`` draws of ``lognormal(mu, sigma)`` reaches but with chance
  :data:`SURE` (``lo`` where none is that sure), at most ``hi``: the largest ``m`` with
  ``P(every draw < m) = Phi((ln m - mu) / sigma) ** clients < SURE`` (bisection on ``ln m``)."""
  def log_all_below(m):
    p = 0.5 * math.erfc(-(math.log(m) - mu) / (sigma * math.sqrt(2)))
    return clients * math.log(p) if p > 0 else -math.inf

  if hi <= lo or log_all_below(lo) >= math.log(SURE):
    return lo
  if log_all_below(hi) < math.log(SURE):
    return hi
  a, b = math.log(lo), math.log(hi)
  for _ in range(60):
    mid = (a + b) / 2
    a, b = (mid, b) if log_all_below(math.exp(mid)) < math.log(SURE) else (a, mid)
  return math.exp(a)


def _defaults(generator) -> dict[str, Any]:
  """The keyword arguments of ``generator`` with their defaults."""
  return {k: v.default for k, v in inspect.signature(generator).parameters.items()}


def planned_size(cfg: ml_collections.ConfigDict) -> PlannedSize | None:
  """The size of the data ``config.data`` generates, from its fields alone (nothing generated):
  ``grouped_synthetic`` and ``synthetic`` (whose populations grow to millions); ``None`` for the
  others (read from files, or bounded: the digits' 1,797 examples). The padded length is the one the
  longest client reaches but with chance :data:`SURE` (the examples per client are lognormal
  draws), so the bytes are a lower bound: a config refused on them cannot fit."""
  name = cfg.get("name", None)
  layout = cfg.get("layout", "padded")
  if name == "grouped_synthetic":
    d = _defaults(synthetic.grouped_synthetic)
    d.update({k: _plain(v) for k, v in cfg.items() if k in d})
    clients, dim = sum(int(g) for g in d["group_sizes"]), int(d["dim"])
    lo, hi, test = int(d["min_examples"]), int(d["max_examples"]), int(d["test_examples"])
    mu = math.log(float(d["mean_examples"])) - 0.5   # the generator's lognormal, sigma 1
    longest = lo if layout == "ragged" else int(_max_draw(clients, mu, 1.0, lo, hi))
  elif name == "synthetic":
    d = _defaults(synthetic.synthetic_alpha_beta)
    d.update({k: _plain(v) for k, v in cfg.items() if k in d})
    clients, dim, scale = int(d["num_clients"]), int(d["dim"]), int(d["samples_scale"])
    cap = math.inf if d["max_examples"] is None else int(d["max_examples"])
    fraction = float(d["test_fraction"])
    base = min(50 * scale, cap)   # every client's examples: (int(lognormal(4, 2)) + 50) x samples_scale
    if layout == "padded" and base < cap:
      top = _max_draw(clients, 4.0, 2.0, 1.0, max(1.0, cap / scale - 50) if cap < math.inf else 1e12)
      base = int(min((int(top) + 50 if top > 1 else 50) * scale, cap))
    test = min(int(round(fraction * base)), base - 1)
    longest = base - test
  else:
    return None
  row = dim * 4 + 4   # a float32 example and its int32 label
  per_client = (longest + test) * row + 8   # padded train and test rows, and their two counts
  if layout == "ragged":
    per_client += 4   # the training rows' offsets
  least = " at least" if layout == "ragged" else ""
  how = f"{clients} clients x ({longest} train + {test} test examples{least} x {row} bytes)"
  return PlannedSize(clients * per_client, clients, how)


_CORPUS_OPTIONS = ("seq_len", "vocab_size", "level", "lowercase", "test_fraction", "min_count", "seed")


def load_natural(name: str, *, cache_dir: str | None = None, **kwargs,
                 ) -> tuple[FederatedData, np.ndarray, DataInfo]:
  """``(data, groups, info)`` of a text corpus or natural split (``info``: group names and
  the vocabulary, when the source has them), converted once and cached in ``cache_dir``
  under a fingerprint of the source files and options (:mod:`fedtree.datasets.cache`;
  ``None``: no cache).

  * ``stdlib_text``: :func:`fedtree.datasets.text.stdlib_corpus` (``packages=``,
    ``min_sentences=``, ...) then :func:`~fedtree.datasets.text.to_federated` (``seq_len=``,
    ``vocab_size=``, ``level=``, ``test_fraction=``, ...);
  * ``text_dir``: ``root=`` of ``<group>/<client>.txt`` files, same options;
  * ``tfds_text``: :func:`~fedtree.datasets.text.tfds_text_corpus` options, same options;
  * ``leaf``: :func:`fedtree.datasets.leaf.load_leaf` (``root=``, ``kind=``, ``group_key=``);
  * ``tff_h5``: :func:`fedtree.datasets.tff_h5.load_tff_h5` (``train_path=``, ``test_path=``,
    ``kind=``, ...).
  """
  import sys

  from fedtree.datasets import cache, text

  def corpus_build(make_corpus):
    opts = {k: kwargs.pop(k) for k in _CORPUS_OPTIONS if k in kwargs}

    def build():
      corpus = make_corpus(**kwargs)
      data, groups, vocab = text.to_federated(corpus, **opts)
      return data, {"groups": groups, "vocab": np.asarray(vocab.tokens),
                    "group_names": np.asarray(corpus.group_names)}

    return build, opts

  if name == "stdlib_text":
    build, opts = corpus_build(text.stdlib_corpus)
    source = [sys.version, kwargs]
  elif name == "text_dir":
    build, opts = corpus_build(text.text_dir_corpus)
    source = cache.source_fingerprint(kwargs["root"]) if cache_dir else None
  elif name == "tfds_text":
    build, opts = corpus_build(text.tfds_text_corpus)
    source = kwargs
  elif name == "leaf":
    from fedtree.datasets.leaf import check_leaf_prepared, load_leaf

    opts = {}

    def build():
      data, groups, extras = load_leaf(**kwargs)
      return data, dict(extras, groups=groups)

    check_leaf_prepared(kwargs.get("root", ""), kwargs.get("kind", ""))   # named, before fingerprinting
    source = cache.source_fingerprint(kwargs["root"]) if cache_dir else None
  else:
    from fedtree.datasets.tff_h5 import ARCHIVES, check_prepared, load_tff_h5

    opts = {}

    def build():
      data, groups, extras = load_tff_h5(**kwargs)
      return data, dict(extras, groups=groups)

    if kwargs.get("kind") in ARCHIVES:   # named, before fingerprinting the files
      check_prepared(kwargs["kind"], kwargs.get("train_path", ""), kwargs.get("test_path", ""))

    source = (cache.source_fingerprint(kwargs["train_path"], kwargs["test_path"]) if cache_dir
              else None)
  key = cache.fingerprint(source, dict(kwargs, name=name, **opts)) if cache_dir else ""
  data, extras, _ = cache.cached(cache_dir, f"{name}-{key}", build)
  info = DataInfo(*(tuple(str(t) for t in extras[k]) if k in extras else None
                    for k in ("group_names", "vocab")))
  if "central_x" in extras:
    info = dataclasses.replace(info, central=(np.asarray(extras["central_x"]),
                                              np.asarray(extras["central_y"], np.int32)))
  return data.validate(), np.asarray(extras["groups"], np.int32), info


def _file_groups(groups, num_clients: int, team_size, num_groups) -> np.ndarray:
  """The groups a loader read, else :func:`consecutive_groups`; both is an error."""
  if groups is None:
    return consecutive_groups(num_clients, team_size, num_groups)
  if team_size or num_groups:
    raise ValueError(f"the data name every client's group; config.data.team_size={team_size} / "
                     f"num_groups={num_groups} would replace them: leave them unset")
  return np.asarray(groups, np.int32)


def _info(extras) -> DataInfo:
  names = extras.get("group_names")
  vocab = extras.get("vocab")
  cols = extras.get("label_columns")
  return DataInfo(group_names=tuple(str(n) for n in names) if names is not None else None,
                  vocab=tuple(str(t) for t in vocab) if vocab is not None else None,
                  label_columns=np.asarray(cols, np.int32) if cols is not None else None)


def consecutive_groups(num_clients: int, team_size: int | None = None,
                       num_groups: int | None = None) -> np.ndarray:
  """``int32[C]`` groups of ``team_size`` consecutive clients, else ``num_groups`` groups of
  consecutive clients (near-equal), else one group."""
  if team_size and num_groups:
    raise ValueError(f"team_size={team_size} and num_groups={num_groups}: set one of them")
  c = int(num_clients)
  if team_size:
    if int(team_size) < 1:
      raise ValueError(f"team_size={team_size} must be >= 1")
    return (np.arange(c) // int(team_size)).astype(np.int32)
  if num_groups:
    if not 1 <= int(num_groups) <= c:
      raise ValueError(f"num_groups={num_groups} must be in [1, {c}] (the number of clients)")
    return (np.arange(c) * int(num_groups) // c).astype(np.int32)
  return np.zeros(c, np.int32)


def _plain(v):
  if isinstance(v, ml_collections.ConfigDict):
    return {k: _plain(x) for k, x in v.items()}
  if isinstance(v, list):
    return tuple(v)
  return v


def load_store(path: str | None = None, dataset: str | None = None, groups: str = "groups"):
  """``config.data`` with ``name="store"``: a population converted to a store (``python -m
  fedtree.convert``), opened, not read: ``(skeleton, group labels, central test, info)``.

  Args:
    path: the store's folder.
    dataset: the dataset the config means (``config.data.dataset``): a store converted from another
      source (its manifest's ``source.name``) is refused; ``None``: any.
    groups: the store's index array of every client's group (absent: one group).

  Raises:
    ValueError: no path, a store that is not complete, or one of another dataset.
  """
  from fedtree.population import open_store
  from fedtree.population.stream import skeleton

  if not path:
    raise ValueError("config.data.name='store' needs config.data.path, the folder written by "
                     "python -m fedtree.convert")
  store = open_store(str(path))
  made_from = store.source.get("name")
  if dataset is not None and made_from != dataset:
    raise ValueError(f"config.data.dataset={dataset!r}, but the store {store.path} was converted from "
                     f"{made_from!r} ({store.source}); convert {dataset!r} or name the store's dataset")
  labels = store.extra(groups)
  labels = np.zeros(store.num_clients, np.int32) if labels is None else np.asarray(labels, np.int32)
  if labels.ndim == 2:   # several columns, coarsest first: the first is the groups
    labels = labels[0]
  central = None
  if "central" in store.splits:
    block = store.read(np.zeros(1, np.int64), "central")
    central = (block.x[0, : int(block.n[0])], block.y[0, : int(block.n[0])])
  return skeleton(store), labels, central, DataInfo(store=store, label_kind=store.label_kind)
