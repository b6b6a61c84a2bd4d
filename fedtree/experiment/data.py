"""``config.data`` -> ``(data, group labels, central test)``: the config side of :mod:`fedtree.datasets`."""

from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from fedtree.core.data import FederatedData
from fedtree.datasets.synthetic import grouped_synthetic, synthetic_alpha_beta

TEXT_DATASETS = ("stdlib_text", "text_dir", "tfds_text", "leaf", "tff_h5")
DATASETS = ("grouped_synthetic", "synthetic", "tfds", "prototype_images", "synthetic_kws",
            "speech_commands") + TEXT_DATASETS


def load(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any]:
  """``(data, group labels [C], central test (x, y) or None)`` from ``config.data``; with a
  ``cfg.transform`` (``{kind, num_transformed, seed}``, see
  :func:`fedtree.datasets.transforms.transform_random_clients`) that many random clients'
  inputs are flipped or rotated, and the groups become 0 (unchanged) / 1 (transformed).
  ``cfg.layout``: ``"padded"`` (default) or ``"ragged"``, the training split stored flat with
  offsets (:func:`fedtree.core.ragged.to_ragged_train`) for long-tailed natural splits."""
  layout = cfg.get("layout", "padded")
  if layout not in LAYOUTS:
    raise ValueError(f"config.data.layout={layout!r}; choose one of {LAYOUTS}")
  transform = cfg.get("transform", None)
  cfg = ml_collections.ConfigDict({k: v for k, v in cfg.items() if k not in ("transform", "layout")})
  data, groups, central = _load(cfg)
  if transform is not None:
    from fedtree.datasets.transforms import transform_random_clients

    data, groups = transform_random_clients(data, **{k: _plain(v) for k, v in transform.items()})
  if layout == "ragged":
    from fedtree.core.ragged import to_ragged_train

    data = to_ragged_train(data)
  return data, groups, central


LAYOUTS = ("padded", "ragged")


def _load(cfg: ml_collections.ConfigDict) -> tuple[FederatedData, np.ndarray, Any]:
  """``(data, group labels [C], central test (x, y) or None)`` from ``config.data``.

  ``cfg.name`` picks the dataset; the other fields are its keyword arguments.
  ``synthetic`` (FedProx/pFedMe) forms groups of ``cfg.team_size`` consecutive clients
  (pFedMT's teams) when given, else one group. ``tfds`` reads the TFDS dataset named by
  ``cfg.dataset`` (the other fields are :func:`fedtree.datasets.tfds_loader.load_tfds`'s).
  """
  kwargs = {k: _plain(v) for k, v in cfg.items() if k not in ("name", "team_size")}
  name = cfg.name
  if name == "grouped_synthetic":
    data, groups = grouped_synthetic(**kwargs)
    return data, groups, None
  if name == "synthetic":
    data = synthetic_alpha_beta(**kwargs)
    team = cfg.get("team_size", None)
    groups = np.arange(data.num_clients) // int(team) if team else np.zeros(data.num_clients, np.int32)
    return data, groups.astype(np.int32), None
  if name == "prototype_images":
    from fedtree.datasets.prototypes import prototype_images

    data = prototype_images(**kwargs)
    return data, np.zeros(data.num_clients, np.int32), None
  if name == "tfds":
    from fedtree.datasets.tfds_loader import load_tfds

    kwargs["name"] = kwargs.pop("dataset", "mnist")
    return load_tfds(team_size=cfg.get("team_size", None), **kwargs)
  if name == "synthetic_kws":
    from fedtree.datasets.synthetic_kws import synthetic_kws

    data = synthetic_kws(**kwargs)
    return data, np.zeros(data.num_clients, np.int32), None
  if name == "speech_commands":
    from fedtree.datasets.speech_commands import load_speech_commands

    return load_speech_commands(**kwargs)
  if name in TEXT_DATASETS:
    data, groups = load_natural(name, **kwargs)
    return data, groups, None
  raise ValueError(f"config.data.name={name!r} is unknown; choose one of {DATASETS}")


_CORPUS_OPTIONS = ("seq_len", "vocab_size", "level", "lowercase", "test_fraction", "min_count", "seed")


def load_natural(name: str, *, cache_dir: str | None = None, **kwargs) -> tuple[FederatedData, np.ndarray]:
  """``(data, groups)`` of a text corpus or natural split, converted once and cached in
  ``cache_dir`` under a fingerprint of the source files and options
  (:mod:`fedtree.datasets.cache`; ``None``: no cache).

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
      data, groups, vocab = text.to_federated(make_corpus(**kwargs), **opts)
      return data, {"groups": groups, "vocab": np.asarray(vocab.tokens)}

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
    from fedtree.datasets.leaf import load_leaf

    opts = {}

    def build():
      data, groups, extras = load_leaf(**kwargs)
      return data, dict(extras, groups=groups)

    source = cache.source_fingerprint(kwargs["root"]) if cache_dir else None
  else:
    from fedtree.datasets.tff_h5 import load_tff_h5

    opts = {}

    def build():
      data, groups, extras = load_tff_h5(**kwargs)
      return data, dict(extras, groups=groups)

    source = (cache.source_fingerprint(kwargs["train_path"], kwargs["test_path"]) if cache_dir
              else None)
  key = cache.fingerprint(source, dict(kwargs, name=name, **opts)) if cache_dir else ""
  data, extras, _ = cache.cached(cache_dir, f"{name}-{key}", build)
  return data.validate(), np.asarray(extras["groups"], np.int32)


def _plain(v):
  if isinstance(v, ml_collections.ConfigDict):
    return {k: _plain(x) for k, x in v.items()}
  if isinstance(v, list):
    return tuple(v)
  return v
