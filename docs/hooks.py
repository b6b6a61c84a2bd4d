"""MkDocs hooks.

* ``<!-- include PATH -->`` in a page is replaced by the repository file PATH (the benchmarks
  page shows ``benchmarks/README.md`` as it is, so the numbers live in one place). Pictures the
  included file links relative to itself (``results/*.png``) are left out: the page shows the
  copies under ``docs/images/``.
* The docstrings' Sphinx roles (``:func:`fedtree.core.loop.run```, ``:class:`~x.Y```), which
  mkdocstrings' Google parser leaves as text, become code, and a cross-reference where the
  name is a full ``fedtree.`` path (unresolved ones stay plain code, never an error).
* A docstring's ``:doc:`title <PAGE.md#anchor>``` (a method's family page, where its equations and
  the peers' implementations are) becomes a link to that docs page; a page that does not exist, or
  an anchor it does not have, fails the build.
"""

import os
import re

from mkdocs.exceptions import PluginError
from mkdocs.utils import get_relative_url

ROLES = "class|func|meth|mod|data|attr|exc|obj|const"
ROLE = re.compile(rf":(?:py:)?(?:{ROLES}):<code>(~?)\.?([\w.]+)(\(\))?</code>")
INCLUDE = re.compile(r"<!-- include (\S+) -->")
PICTURE = re.compile(r"^!\[[^\]]*\]\((?!https?:)[^)]*\)\s*$", re.MULTILINE)
DOC = re.compile(r":doc:<code>([^<]*?)\s*&lt;([\w/.-]+\.md)(?:#([\w-]+))?&gt;</code>")
_ANCHORS: list[tuple[str, str, str]] = []   # (linking page, target page's file, anchor) to check


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
  def doc(match):
    title, path, anchor = match.group(1), match.group(2), match.group(3)
    target = files.get_file_from_path(path)
    if target is None:
      raise PluginError(f"{page.file.src_uri}: :doc: link to {path}, which is not a docs page")
    if anchor:
      _ANCHORS.append((page.file.src_uri, target.dest_uri, anchor))
    url = get_relative_url(target.url, page.url) + (f"#{anchor}" if anchor else "")
    return f'<a href="{url}">{title}</a>'

  return ROLE.sub(_role, DOC.sub(doc, html))


def on_post_build(config):
  missing = []
  for source, dest, anchor in _ANCHORS:
    with open(os.path.join(config["site_dir"], dest), encoding="utf-8") as f:
      if f'id="{anchor}"' not in f.read():
        missing.append(f"{source}: #{anchor} is not a heading of {dest}")
  _ANCHORS.clear()
  if missing:
    raise PluginError("; ".join(sorted(set(missing))))
