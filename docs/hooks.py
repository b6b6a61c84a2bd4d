"""MkDocs hooks.

* ``<!-- include PATH -->`` in a page is replaced by the repository file PATH (the benchmarks
  page shows ``benchmarks/README.md`` as it is, so the numbers live in one place). Pictures the
  included file links relative to itself (``results/*.png``) are left out: the page shows the
  copies under ``docs/images/``.
* The docstrings' Sphinx roles (``:func:`fedtree.core.loop.run```, ``:class:`~x.Y```), which
  mkdocstrings' Google parser leaves as text, become code, and a cross-reference where the
  name is a full ``fedtree.`` path (unresolved ones stay plain code, never an error).
"""

import os
import re

ROLES = "class|func|meth|mod|data|attr|exc|obj|const"
ROLE = re.compile(rf":(?:py:)?(?:{ROLES}):<code>(~?)\.?([\w.]+)(\(\))?</code>")
INCLUDE = re.compile(r"<!-- include (\S+) -->")
PICTURE = re.compile(r"^!\[[^\]]*\]\((?!https?:)[^)]*\)\s*$", re.MULTILINE)


def on_page_markdown(markdown, page, config, files):
  root = os.path.dirname(config["config_file_path"])

  def include(match):
    with open(os.path.join(root, match.group(1)), encoding="utf-8") as f:
      text = f.read()
    return PICTURE.sub("", text.split("\n", 1)[1])  # the file's title is the page's

  return INCLUDE.sub(include, markdown)


def _role(match):
  short, name, call = match.group(1), match.group(2), match.group(3) or ""
  shown = (name.rsplit(".", 1)[-1] if short else name) + call
  if name.startswith("fedtree."):
    return f'<autoref identifier="{name}" optional><code>{shown}</code></autoref>'
  return f"<code>{shown}</code>"


def on_page_content(html, page, config, files):
  return ROLE.sub(_role, html)
