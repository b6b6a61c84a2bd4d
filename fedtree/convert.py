r"""Convert a run's data into a store of clients on disk, read by client id.

  python -m fedtree.convert --config=configs/benchmarks/afo_stackoverflow.py --out=/data/so_store \
      --config.data.train_path=DIR/stackoverflow_train.h5 --config.data.test_path=DIR/stackoverflow_test.h5
  python -m fedtree.convert --data="{'name': 'flair', 'path': 'DIR/flair_federated.hdf5'}" --out=/data/flair

The source is the ``data`` block of a config (``--config``, with ``--config.data.<field>=...``
overrides) or a dict literal (``--data``): any source fedtree reads (``config.data.name`` one of
:data:`fedtree.experiment.data.DATASETS`), and FLAIR in pfl-research's HDF5 layout
(``name="flair"``: ``path``, ``labels``, ``central``; :func:`fedtree.population.convert.convert_flair`).
TFF's EMNIST, Shakespeare and StackOverflow h5 files and FLAIR are read one client at a time
(memory stays flat); the other sources are loaded by their loader, then written. A progress bar
shows the clients written. The store is written into ``<out>.partial`` and renamed when complete;
it records the data block, and a run that opens it with another dataset is refused
(:meth:`fedtree.population.store.ClientStore.check_source`). A refused input prints one line.
"""

from __future__ import annotations

import ast
import os
import sys
import time
from typing import Any

from absl import app, flags
from ml_collections import config_flags


def _define_flags():
  """The command's flags, defined when it runs (``python -m fedtree.convert``), not when
  :func:`convert` is imported beside ``fedtree.main``, whose ``--config`` has the same name."""
  config_flags.DEFINE_config_file("config", None, "A fedtree config file: its data block is converted.",
                                  lock_config=False)
  flags.DEFINE_string("data", None, "The data block as a Python dict literal (instead of --config).")
  flags.DEFINE_string("out", None, "The store's folder.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing store at --out once the new one is complete.")
  flags.DEFINE_bool("progress", True, "Progress bars.")
  flags.DEFINE_bool("verbose", False, "Full tracebacks for refused inputs.")


SOURCES_STREAMED = ("tff_h5", "flair")


def convert(data: dict[str, Any], out: str, *, overwrite: bool = False, progress: bool = True):
  """Converts the source ``data`` names (a ``config.data`` block as a plain dict) into a store.

  Args:
    data: the data block (``name`` and the loader's fields).
    out: the store's folder.
    overwrite: replace an existing store once the new one is complete.
    progress: progress bars.

  Returns:
    The opened :class:`fedtree.population.store.ClientStore`.

  Raises:
    ValueError: an unknown source name (listing the names), or what the source's loader refuses.
  """
  import numpy as np

  from fedtree.experiment.data import DATASETS
  from fedtree.population import convert as streamed
  from fedtree.population.store import write_federated_data

  data = {k: _plain(v) for k, v in dict(data).items()}
  if os.path.exists(out) and not overwrite:   # before the source is read
    raise ValueError(f"{os.path.abspath(out)} exists; choose another path or overwrite it (--overwrite)")
  name = data.get("name")
  names = DATASETS + ("flair",)
  if name not in names:
    raise ValueError(f"data.name={name!r}; choose one of {names}")
  options = {k: v for k, v in data.items() if k not in ("name", "cache_dir", "layout")}
  if name == "flair":
    options["h5_path"] = options.pop("path", None)
    if not options["h5_path"]:
      raise ValueError("data.path is not set: the FLAIR .hdf5 file pfl-research's prepare_dataset.py writes")
    return streamed.convert_flair(out, source=data, overwrite=overwrite, progress=progress, **options)
  if name == "tff_h5" and "transform" not in options:
    return streamed.convert_tff_h5(out, source=data, overwrite=overwrite, progress=progress, **options)
  import ml_collections

  from fedtree.experiment.data import load_with_info

  fed, groups, central, info = load_with_info(ml_collections.ConfigDict(data))
  extras = {k: np.asarray(v) for k, v in (("group_names", info.group_names), ("vocab", info.vocab),
                                          ("label_columns", info.label_columns)) if v is not None}
  return write_federated_data(out, fed, source=data, groups=groups, central=central, extras=extras,
                              overwrite=overwrite, progress=progress)


def _plain(v):
  import ml_collections

  if isinstance(v, ml_collections.ConfigDict):
    return {k: _plain(x) for k, x in v.items()}
  if isinstance(v, list):
    return tuple(_plain(x) for x in v)
  return v


def main(argv) -> None:
  f = flags.FLAGS
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    if (f.config is None) == (f.data is None):
      raise ValueError("give the source as --config=FILE (its data block) or --data=DICT, one of them")
    if not f.out:
      raise ValueError("--out is not set: the store's folder")
    if f.data is not None:
      try:
        data = ast.literal_eval(f.data)
      except (ValueError, SyntaxError) as e:
        raise ValueError(f"--data={f.data!r} is not a Python dict literal ({e})") from e
      if not isinstance(data, dict):
        raise ValueError(f"--data={f.data!r} is not a dict")
    else:
      data = f.config.data.to_dict()
    t0 = time.perf_counter()
    store = convert(data, f.out, overwrite=f.overwrite, progress=f.progress)
  except Exception as e:  # noqa: BLE001 (one clear line; the traceback behind --verbose)
    if f.verbose:
      raise
    print(f"fedtree: error: {' '.join(str(e).split())}", file=sys.stderr)
    sys.exit(1)
  mb = sum(s["bytes"] for s in store.manifest["splits"].values()) / 1e6
  print(f"fedtree: wrote {store!r}: {mb:,.1f} MB in {time.perf_counter() - t0:.1f} s; "
        f"fingerprint {store.fingerprint[:16]}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
