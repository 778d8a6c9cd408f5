"""Checks of the built site and of the stored tutorials (used by ``specdec_docs.py``; stdlib only).

* :func:`notebook_problems` — a tutorial must be stored *executed*: every code cell run once, top to
  bottom in one kernel (execution counts 1, 2, 3, ...), no error output, nothing on stderr (the site
  shows stored outputs; a red stderr block or ``In [ ]:`` without output is a broken page).
* :func:`site_problems` — every internal ``href``/``src`` of every built HTML page points at a file
  of the site and, with ``#anchor``, at an id on that page; no page loads a script, a stylesheet or
  a font from outside the site (the site works offline).
"""

from __future__ import annotations

import json
import posixpath
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


def notebook_problems(path: Path) -> list[str]:
    """What is wrong with the outputs stored in one notebook (empty list: fine)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    problems = []
    expected = 1
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code" or not "".join(cell.get("source", [])).strip():
            continue
        count = cell.get("execution_count")
        if count is None:
            problems.append(f"cell {i} was never executed (no stored outputs)")
        elif count != expected:
            problems.append(f"cell {i} has execution count {count}, expected {expected} (not run top to bottom in one kernel)")
        expected = (count or expected) + 1
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i} stored an error: {out.get('ename')}: {out.get('evalue', '')[:80]}")
            elif out.get("output_type") == "stream" and out.get("name") == "stderr":
                first = "".join(out.get("text", "")).strip().splitlines()[:1]
                problems.append(f"cell {i} stored output on stderr: {first[0][:100] if first else ''!r}")
    return problems


class _Page(HTMLParser):
    """Ids of one page, the links it makes, the external resources it loads."""

    LINK_ATTRS = {"a": "href", "link": "href", "img": "src", "script": "src", "iframe": "src", "source": "src",
                  "image": "href", "use": "href"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if a.get(key):
                self.ids.add(a[key])
        target = a.get(self.LINK_ATTRS.get(tag, ""), None)
        if tag in ("use", "image") and target is None:
            target = a.get("xlink:href")
        if not target:
            return
        scheme = urlsplit(target).scheme
        external = target.startswith("//") or scheme in ("http", "https")
        rel = (a.get("rel") or "").split()
        if external:
            if tag in ("script", "iframe") or (tag == "link" and rel and not {"stylesheet", "preconnect", "preload", "modulepreload", "icon"}.isdisjoint(rel)):
                self.external.append(f"<{tag}> {target}")
            return
        if scheme or tag == "link" and "canonical" in rel:
            return  # data:, mailto:, javascript:, ...
        self.links.append(target)

    handle_startendtag = handle_starttag


def site_problems(site: Path, skip_anchor_pages: tuple[str, ...] = ()) -> list[str]:
    """Broken internal links/anchors and external scripts/styles/fonts in the built ``site``."""
    pages: dict[str, _Page] = {}
    for f in sorted(site.rglob("*.html")):
        parser = _Page()
        parser.feed(f.read_text(encoding="utf-8", errors="replace"))
        pages[f.relative_to(site).as_posix()] = parser
    problems = []
    for name, page in pages.items():
        for ext in page.external:
            problems.append(f"{name}: loads {ext} from outside the site (the site must work offline)")
        base = posixpath.dirname(name)
        for link in dict.fromkeys(page.links):
            parts = urlsplit(link)
            path, anchor = unquote(parts.path), unquote(parts.fragment)
            if path.startswith("/"):
                problems.append(f"{name}: absolute link {link!r} breaks when the site is served under a sub-path")
                continue
            target = posixpath.normpath(posixpath.join(base, path)) if path else name
            if target.startswith(".."):
                problems.append(f"{name}: link {link!r} leaves the site")
                continue
            if (site / target).is_dir() or path.endswith("/"):
                target = posixpath.join(target, "index.html").lstrip("./") if target != "." else "index.html"
            if not (site / target).is_file():
                problems.append(f"{name}: broken link {link!r} (no {target})")
                continue
            if anchor and target.endswith(".html") and target not in skip_anchor_pages:
                if target in pages and anchor not in pages[target].ids:
                    problems.append(f"{name}: link {link!r}: no id {anchor!r} on {target}")
    return problems
