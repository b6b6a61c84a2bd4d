"""A fingerprinted on-disk cache of converted federated arrays.

Converting a natural split (LEAF JSON, TFF h5, a text corpus) into padded arrays takes
seconds to minutes; a second run should not pay it again. :func:`cached` keys the converted
arrays by a fingerprint of the source (every file's path relative to the source root, size
and modification time; :func:`source_fingerprint`) and the conversion options, and stores
them as one ``.npz`` per fingerprint in ``cache_dir``. A changed source file or option gives
a new fingerprint, hence a fresh conversion; nothing is ever read back under a stale key.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from fedtree.core.data import _ARRAY_FIELDS, FederatedData

CACHE_VERSION = 1


def source_fingerprint(*paths: str) -> list:
  """``[(relative path, size, mtime_ns), ...]`` of every file under each path, sorted.

  Raises:
    ValueError: a path does not exist.
  """
  out = []
  for root in paths:
    if os.path.isfile(root):
      st = os.stat(root)
      out.append((os.path.basename(root), st.st_size, st.st_mtime_ns))
      continue
    if not os.path.isdir(root):
      raise ValueError(f"source path {root!r} does not exist")
    for dirpath, dirnames, filenames in os.walk(root):
      dirnames.sort()
      for fn in sorted(filenames):
        p = os.path.join(dirpath, fn)
        st = os.stat(p)
        out.append((os.path.relpath(p, root), st.st_size, st.st_mtime_ns))
  return out


def fingerprint(source: Any, options: dict) -> str:
  """sha256 (hex, 24 characters) of the JSON of ``(version, source, options)``."""
  blob = json.dumps([CACHE_VERSION, source, options], sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:24]


def save(path: str, data: FederatedData, extras: dict[str, np.ndarray]) -> None:
  """Writes ``data``'s arrays, its ``num_classes`` and ``extras`` (``extra_<name>``)."""
  arrays = {f: np.asarray(getattr(data, f)) for f in _ARRAY_FIELDS}
  arrays["num_classes"] = np.asarray(data.num_classes)
  arrays.update({f"extra_{k}": np.asarray(v) for k, v in extras.items()})
  tmp = path + ".tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


def load(path: str) -> tuple[FederatedData, dict[str, np.ndarray]]:
  with np.load(path, allow_pickle=False) as z:
    fields = {f: z[f] for f in _ARRAY_FIELDS}
    extras = {k[len("extra_"):]: z[k] for k in z.files if k.startswith("extra_")}
    data = FederatedData(**fields, num_classes=int(z["num_classes"]))
  return data, extras


def cached(cache_dir: str | None, key: str, build: Callable[[], tuple[FederatedData, dict[str, np.ndarray]]],
           ) -> tuple[FederatedData, dict[str, np.ndarray], bool]:
  """``(data, extras, hit)``: the arrays stored under ``key`` in ``cache_dir``, or ``build()``'s
  result, stored there. ``cache_dir=None`` always builds. Extras are plain arrays (e.g. group
  labels, vocabulary tokens as a string array)."""
  if cache_dir is None:
    return (*build(), False)
  os.makedirs(cache_dir, exist_ok=True)
  path = os.path.join(cache_dir, f"{key}.npz")
  if os.path.exists(path):
    data, extras = load(path)
    return data, extras, True
  data, extras = build()
  save(path, data, extras)
  return data, extras, False

