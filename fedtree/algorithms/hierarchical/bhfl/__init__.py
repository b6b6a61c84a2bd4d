"""B-HFL (paper 001) and its helpers: buffered asynchrony and the table by level."""

from fedtree.algorithms.hierarchical.bhfl.bhfl import (
  BHFLState,
  ProxyData,
  bhfl,
  central_test_set,
  format_level_table,
  level_name,
  level_table,
  proxy_from_clients,
  with_level_report,
)

__all__ = [
  "BHFLState", "ProxyData", "bhfl", "central_test_set", "format_level_table", "level_name",
  "level_table", "proxy_from_clients", "with_level_report",
]
