"""MkDocs hooks of the specdec site (build-time only; not part of the package).

* ``on_config``: fill the *Tutorials* section of the nav from ``tutorials/*.ipynb`` and add the
  component pages other engineers write (``selectors/*.md``, ``dustin.md``, ...) once they exist,
  so the nav never points at a missing page.
* ``on_env``: turn Sphinx roles left in docstrings (``:class:`X```) into cross-references.
* ``on_page_markdown``: expand three markers
  - ``<!-- cli-reference -->``: one section per ``specdec`` sub-command, built from the Typer app
    (usage, help text, an options table) — new commands (``tune``, ``profile-srh``, ...) appear by
    themselves;
  - ``<!-- api-modules: PACKAGE [EXCLUDE ...] -->``: a ``::: module`` block per module of a package;
  - ``<!-- benchmark-summary -->``, ``<!-- benchmark-summary-plot -->``, ``<!-- benchmark-summary-runs -->``:
    the best measured tokens/s per method and shape, its chart, and the runs (machine, date,
    command) its cells cite (``benchpage.py``);
  - ``<!-- benchmark-results -->``: every report in ``benchmarks/results/`` (cleaned) and its plot.
* ``on_pre_build``: refuse a tutorial stored without its outputs (``sitecheck.notebook_problems``).
* ``on_page_content``: notebook pages get working links (mkdocs-jupyter leaves ``x.md``/``x.ipynb``
  links as they are) and a table of contents whose anchors exist; math becomes MathML.
* ``on_post_template``: ``404.html`` with relative links. ``on_post_build``: every internal link and
  anchor of the built site resolves, and no page loads anything from outside the site
  (``sitecheck.site_problems``); each problem is a warning, so ``mkdocs build --strict`` fails.
"""

from __future__ import annotations

import html as html_lib
import json
import logging
import pkgutil
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.utils import get_relative_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchpage  # noqa: E402  (docs/hooks/benchpage.py)
import sitecheck  # noqa: E402  (docs/hooks/sitecheck.py)

log = logging.getLogger("mkdocs.hooks.specdec_docs")  # under "mkdocs": a warning fails --strict
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"

# pages written by other engineers: (nav section, title, path relative to docs/)
OPTIONAL_PAGES = [
    ("Components", "Selector reference", "selectors"),
    ("Components", "Drafters", "drafters.md"),
    ("Components", "Verifiers", "verifiers.md"),
    ("Components", "Dustin", "dustin.md"),
    ("Components", "Optimized backends", "backends.md"),
    ("Components", "Vegas tuner", "tuner.md"),
]


def _title_of(path: Path) -> str:
    """First ``# heading`` of a Markdown file or notebook, else the file stem."""
    try:
        if path.suffix == ".ipynb":
            nb = json.loads(path.read_text(encoding="utf-8"))
            text = "".join(
                "".join(c["source"]) + "\n" for c in nb.get("cells", []) if c.get("cell_type") == "markdown"
            )
        else:
            text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return path.stem
    m = re.search(r"^#\s+(.+)$", text, re.M)
    if not m:
        return path.stem.replace("_", " ").replace("-", " ").capitalize()
    return plain_title(m.group(1))


def plain_title(heading: str) -> str:
    """A Markdown heading as plain text for the nav, the browser title and the footer, which show
    titles verbatim: ``Quest (`quest`)`` → ``Quest (quest)``; links keep their label."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"(\*\*|__|`)", "", text)
    return re.sub(r"\s+", " ", text).strip()


def _section(nav: list, name: str) -> list | None:
    for item in nav:
        if isinstance(item, dict) and name in item and isinstance(item[name], list):
            return item[name]
    return None


def _use_this_checkout() -> None:
    """Document this checkout's specdec, not another installed copy (mkdocs restores sys.path after
    loading a hook module, so this runs from ``on_config``, not at import)."""
    if not sys.path or sys.path[0] != str(ROOT):
        sys.path.insert(0, str(ROOT))


def on_config(config, **kwargs):
    _use_this_checkout()
    nav = config.get("nav")
    if not nav:
        return config
    tutorials = _section(nav, "Tutorials")
    if tutorials is not None:
        listed = {next(iter(e.values())) for e in tutorials if isinstance(e, dict)}
        for nb in sorted((DOCS / "tutorials").glob("*.ipynb")):
            rel = f"tutorials/{nb.name}"
            if rel not in listed:
                tutorials.append({_title_of(nb): rel})
    for section, title, rel in OPTIONAL_PAGES:
        target = _section(nav, section)
        if target is None:
            continue
        path = DOCS / rel
        if path.is_dir():
            pages = sorted(path.glob("*.md"))
            if pages:
                target.append({title: [{_title_of(p): f"{rel}/{p.name}"} for p in pages]})
        elif path.is_file():
            target.append({title: rel})
    return config


# -- CLI reference ---------------------------------------------------------------------------------
def _cli_markdown() -> str:
    import typer.main

    from specdec.cli import app

    group = typer.main.get_command(app)
    out = []
    for name, cmd in group.commands.items():
        out.append(f"## `specdec {name}`\n")
        if cmd.help:
            out.append(cmd.help.strip() + "\n")
        params = [p for p in cmd.params if getattr(p, "opts", None) and "--help" not in p.opts]
        def is_arg(p) -> bool:
            return getattr(p, "param_type_name", "") == "argument"

        usage = " ".join(
            (p.name or "").upper() if is_arg(p) else (p.opts[0] if getattr(p, "is_flag", False) else f"{p.opts[0]} …")
            for p in params
            if p.required
        )
        out.append(f"```text\nspecdec {name} {usage} [OPTIONS]\n```\n")
        if params:
            out.append("| option | required | default | description |\n|---|---|---|---|")
            for p in params:
                names = [(p.name or "").upper()] if is_arg(p) else [*p.opts, *getattr(p, "secondary_opts", [])]
                opts = ", ".join(f"`{o}`" for o in names)
                default = "" if p.required or p.default is None else f"`{p.default}`"
                text = html_lib.escape(p.help or "").replace("|", "\\|")
                rng = []
                if getattr(p, "min", None) is not None:
                    rng.append(f"≥ {p.min}")
                if getattr(p, "max", None) is not None:
                    rng.append(f"≤ {p.max}")
                if rng:
                    text += f" ({', '.join(rng)})"
                out.append(f"| {opts} | {'yes' if p.required else ''} | {default} | {text} |")
            out.append("")
    return "\n".join(out)


# -- API modules -----------------------------------------------------------------------------------
def _api_modules(package: str, exclude: list[str]) -> str:
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return ""  # a plain module (or nothing): the page documents it with ::: itself
    names = sorted(
        f"{package}.{m.name}" for m in pkgutil.iter_modules(spec.submodule_search_locations) if not m.name.startswith("_")
    )
    blocks = [f"::: {n}\n" for n in names if n not in exclude and n.rsplit(".", 1)[-1] not in exclude]
    return "\n".join(blocks) if blocks else "*None installed yet.*\n"


# -- benchmarks ------------------------------------------------------------------------------------
def _plot_rows(rows: list[dict], title: str, context: object = "") -> str | None:
    """An inline SVG: τ and tokens/s per method, one bar group per (document, context, batch) setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def setting(r: dict) -> tuple:
        return (r.get("document", ""), r.get("context", context), r.get("batch", r.get("B", "")))

    methods = list(dict.fromkeys(r["method"] for r in rows))
    settings = list(dict.fromkeys(setting(r) for r in rows))
    if not methods or not settings:
        return None
    value = {(r["method"], setting(r)): r for r in rows}
    width = 0.8 / len(methods)
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 1.2 * len(settings) * 2), 3.4))
    for ax, key, label in ((axes[0], "tau", "mean accepted length τ"), (axes[1], "tokens_per_second", "tokens / s")):
        for i, m in enumerate(methods):
            ys = [float((value.get((m, st)) or {}).get(key) or float("nan")) for st in settings]
            ax.bar([j + i * width for j in range(len(settings))], ys, width, label=m)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(settings))],
                      ["\n".join(x for x in (str(d), f"ctx {c}" if c != "" else "", f"B={b}" if b != "" else "") if x)
                       for d, c, b in settings], fontsize=7)
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].set_yscale("log")  # batch sizes differ by orders of magnitude
    axes[1].set_title("tokens / s (log scale)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return benchpage.svg_of(fig)


def _benchmarks_markdown() -> str:
    text = benchpage.runs_markdown(RESULTS, ROOT, _plot_rows)
    for phrase in benchpage.internal_wording(text):
        log.warning("benchmarks/results: %r is internal wording; say what was measured or fixed instead", phrase)
    return text


def _benchmark_summary_plot() -> str:
    svg = benchpage.summary_plot(RESULTS)
    return f'<figure class="bench-plot">{svg}</figure>\n' if svg else ""


_ROLE_RE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):<code>(~?)([\w.]+)</code>")
_ID_RE = re.compile(r'id="(specdec(?:\.\w+)+)"')


_PAGE_IDS: dict[str, list[str]] = {}  # page src path -> documented object ids (shortest first)


_MATH_RE = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">\s*(?:\\\((?P<inline>.*?)\\\)|\\\[(?P<block>.*?)\\\])\s*</(?P=tag)>', re.S
)


_OPNAME_LIMITS_RE = re.compile(r"\\operatorname\*\{([^{}]*)\}_\{((?:[^{}]|\{[^{}]*\})*)\}")
_OPNAME_RE = re.compile(r"\\operatorname\*?\{([^{}]*)\}")


def tex_for_mathml(tex: str) -> str:
    """Rewrite what latex2mathml gets wrong: ``\\operatorname*{arg\\,max}_{T}`` (it shows ``*arg max``
    in italics) becomes ``\\underset{T}{\\mathrm{arg\\,max}}``; ``\\operatorname{f}`` becomes ``\\mathrm{f}``."""
    tex = _OPNAME_LIMITS_RE.sub(lambda m: f"\\underset{{{m.group(2)}}}{{\\mathrm{{{m.group(1)}}}}}", tex)
    return _OPNAME_RE.sub(lambda m: f"\\mathrm{{{m.group(1)}}}", tex)


def _mathml(html: str, where: str = "") -> str:
    """Render ``pymdownx.arithmatex`` TeX to MathML at build time: math shows without JavaScript or
    a CDN (browsers render MathML natively). TeX that latex2mathml cannot convert stays as text,
    with a warning (the strict build fails)."""
    from latex2mathml.converter import convert

    def repl(m: re.Match) -> str:
        tex = html_lib.unescape(m.group("inline") if m.group("inline") is not None else m.group("block"))
        tex = re.sub(r"\\text\{([^}]*)\}", lambda t: "\\text{" + t.group(1).replace("\\_", "_") + "}", tex)
        block = m.group("block") is not None
        try:
            out = convert(tex_for_mathml(tex.strip()), display="block" if block else "inline")
        except Exception as exc:  # noqa: BLE001 - latex2mathml raises many types; reported, not hidden
            log.warning("%s: cannot render this TeX to MathML (%s): %s", where, exc, tex.strip()[:120])
            return m.group(0)
        return f'<div class="math-block">{out}</div>' if block else out

    return _MATH_RE.sub(repl, html)


_PROTECTED_RE = re.compile(r"(<pre\b.*?</pre>|<code\b.*?</code>|<script\b.*?</script>|<style\b.*?</style>)", re.S)
_DOLLAR_RE = re.compile(
    r"\$\$(?P<block>[^$<>]+?)\$\$|(?<![\\$\w])\$(?=[^\s$])(?P<inline>[^$<>\n]+?)(?<=[^\s\\])\$(?![\w$])", re.S
)


def _notebook_mathml(html: str) -> str:
    """Notebook Markdown cells keep ``$...$`` / ``$$...$$`` math as text; render it to MathML outside
    code, scripts and styles. Anything latex2mathml cannot convert stays as written."""
    from latex2mathml.converter import convert

    def repl(m: re.Match) -> str:
        block = m.group("block") is not None
        tex = html_lib.unescape(m.group("block") if block else m.group("inline"))
        try:
            out = convert(tex_for_mathml(tex.strip()), display="block" if block else "inline")
        except Exception:  # noqa: BLE001
            return m.group(0)
        return f'<div class="math-block">{out}</div>' if block else out

    parts = _PROTECTED_RE.split(html)
    return "".join(part if i % 2 else _DOLLAR_RE.sub(repl, part) for i, part in enumerate(parts))


_HREF_RE = re.compile(r'(<a\b[^>]*?\shref=")([^"#:]+\.(?:md|ipynb))(#[^"]*)?"')
_HEADING_ID_RE = re.compile(r"<h[1-6]\b[^>]*?\sid=\"([^\"]+)\"")


def notebook_links(html: str, page, files) -> str:
    """mkdocs converts ``x.md`` links in Markdown pages, not in notebook pages: do it here, so a
    notebook keeps links that also work in Jupyter (``../concepts/memory-bound.md``) and the site
    gets ``../../concepts/memory-bound/``. A link to no page is left as written (the link check fails it)."""
    base = Path(page.file.src_uri).parent

    def repl(m: re.Match) -> str:
        target = files.get_file_from_path(posixpath.normpath((base / m.group(2)).as_posix()))
        if target is None:
            return m.group(0)
        return f'{m.group(1)}{get_relative_url(target.url, page.url)}{m.group(3) or ""}"'

    return _HREF_RE.sub(repl, html)


def notebook_toc(html: str, page) -> None:
    """mkdocs-jupyter slugs the table of contents itself (``## Reading `RunStats``` → ``#reading``)
    while nbconvert gives the heading ``id="reading-runstats"``: use the headings' real ids, in order."""
    def flat(items):
        for item in items:
            yield item
            yield from flat(item.children)

    items = list(flat(page.toc or []))
    ids = _HEADING_ID_RE.findall(html)
    if len(items) == len(ids):
        for item, ident in zip(items, ids):
            item.id = ident


def on_page_content(html, page, config, files, **kwargs):
    """Remember which API objects each page documents (used by :func:`on_env`); render math; fix a
    notebook page's links and table of contents."""
    _PAGE_IDS[page.file.src_path] = sorted(set(_ID_RE.findall(html)), key=len)
    if page.file.src_path.endswith(".ipynb"):
        html = notebook_links(html, page, files)
        notebook_toc(html, page)
        if "$" in html:
            html = _notebook_mathml(html)
    return _mathml(html, page.file.src_uri) if "arithmatex" in html else html


def on_env(env, config, files, **kwargs):
    """Turn Sphinx roles left in docstrings (``:class:`~specdec.cache.KVCache```) into cross-references.

    mkdocstrings' Google parser leaves them as text; each becomes an ``<autoref>`` that
    mkdocs-autorefs resolves right after this hook (``optional``: an unknown name stays plain code,
    no warning). A relative name is looked up first among the objects documented on the same page,
    then on every page.
    """
    everywhere = sorted({i for ids in _PAGE_IDS.values() for i in ids}, key=len)
    for file in files:
        page = file.page
        if page is None or not page.content or ":<code>" not in page.content:
            continue
        local = _PAGE_IDS.get(file.src_path, [])

        def repl(m: re.Match) -> str:
            tilde, name = m.group(1), m.group(2)
            ident = name
            if not name.startswith("specdec."):
                ident = next((i for i in [*local, *everywhere] if i.endswith("." + name)), name)
            title = name.rsplit(".", 1)[-1] if tilde else name
            return f'<autoref identifier="{ident}" optional><code>{title}</code></autoref>'

        page.content = _ROLE_RE.sub(repl, page.content)
    return env


_API_RE = re.compile(r"<!--\s*api-modules:\s*([\w.]+)((?:\s+[\w.]+)*)\s*-->")


def on_page_markdown(markdown, page, config, files, **kwargs):
    if re.search(r"^\s*(```|~~~)+\s*mermaid", markdown, re.M):
        log.warning("%s: a mermaid fence would load mermaid from a CDN; draw the diagram in "
                    "docs/assets/diagrams/NAME.mmd, render it with scripts/render_diagrams.sh and show the SVG",
                    page.file.src_uri)
    if "<!-- benchmark-summary -->" in markdown:
        table, runs = benchpage.summary_parts(RESULTS)
        markdown = markdown.replace("<!-- benchmark-summary -->", table)
        markdown = markdown.replace("<!-- benchmark-summary-runs -->", runs)
    if "<!-- benchmark-summary-plot -->" in markdown:
        markdown = markdown.replace("<!-- benchmark-summary-plot -->", _benchmark_summary_plot())
    if "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", _cli_markdown())
    if "<!-- benchmark-results -->" in markdown:
        markdown = markdown.replace("<!-- benchmark-results -->", _benchmarks_markdown())
    markdown = _API_RE.sub(lambda m: _api_modules(m.group(1), m.group(2).split()), markdown)
    return markdown


def on_pre_build(config, **kwargs):
    """Refuse a tutorial stored without its outputs: the site shows what the notebook stores."""
    bad = []
    for nb in sorted((DOCS / "tutorials").glob("*.ipynb")):
        bad += [f"tutorials/{nb.name}: {p}" for p in sitecheck.notebook_problems(nb)]
    if bad:
        raise PluginError("tutorials stored without clean executed outputs (run "
                          "`bash scripts/execute_tutorials.sh NOTEBOOK` and commit it):\n  " + "\n  ".join(bad))


_ABS_ATTR_RE = re.compile(r'((?:href|src|action)=")/(?!/)')


def on_post_template(output_content, template_name, config, **kwargs):
    """``404.html`` is rendered for the site root with absolute links (``/tutorials/``), which break
    when the site is served under a sub-path or opened from disk: make them relative to the root."""
    if template_name == "404.html" and not config.get("site_url"):
        out = _ABS_ATTR_RE.sub(r"\1./", output_content)
        # the theme's JSON config: search index and worker relative to the root as well
        return out.replace('"base": "/"', '"base": "."').replace('"search": "/assets/', '"search": "./assets/')
    return output_content


def on_post_build(config, **kwargs):
    """Every internal link and anchor of the built site resolves; nothing is loaded from outside."""
    problems = sitecheck.site_problems(Path(config["site_dir"]))
    for p in problems:
        log.warning("site check: %s", p)
    if problems and config.get("strict"):  # also under `mkdocs build -q`, which drops warnings before they are counted
        raise PluginError(f"site check: {len(problems)} broken link(s), anchor(s) or external load(s), listed above")
