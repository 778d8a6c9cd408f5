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
  - ``<!-- benchmark-results -->``: the Markdown tables in ``benchmarks/results/*.md`` and a plot
    per ``benchmarks/results/*.json`` written by ``specdec bench``.
"""

from __future__ import annotations

import html as html_lib
import io
import json
import pkgutil
import re
import sys
from pathlib import Path

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
    return m.group(1).strip() if m else path.stem.replace("_", " ").replace("-", " ").capitalize()


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
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


_LINK_RE = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _local_link(m: re.Match, base: Path) -> str:
    """Links inside an included result file point next to it, outside docs/: inline images as data
    URIs, show other relative targets as a path (a broken link would fail the strict build)."""
    bang, label, target = m.groups()
    if re.match(r"^[a-z]+:|^#", target):
        return m.group(0)
    path = (base / target).resolve()
    mime = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}.get(path.suffix.lower())
    if bang and mime and path.is_file():
        import base64

        return f"![{label}](data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()})"
    try:
        shown = path.relative_to(ROOT)
    except ValueError:
        shown = Path(target)
    return f"{label} (`{shown}`)"


def _benchmarks_markdown() -> str:
    if not RESULTS.is_dir():
        return "*No benchmark results yet: run `specdec bench` (see below).*\n"
    out = []
    for md in sorted(RESULTS.glob("*.md")):
        text = md.read_text(encoding="utf-8")
        text = re.sub(r"^(#+)", r"##\1", text, flags=re.M)  # demote below this page's "## Results"
        text = _LINK_RE.sub(lambda m: _local_link(m, md.parent), text)
        out.append(text)
        js = md.with_suffix(".json")
        if js.is_file():
            try:
                rows = json.loads(js.read_text(encoding="utf-8")).get("rows", [])
                svg = _plot_rows([r for r in rows if "method" in r], md.stem)
            except Exception:  # noqa: BLE001 - a result file of another shape: table only, never a failed build
                svg = None
            if svg:
                out.append(f'<figure class="bench-plot">{svg}</figure>\n')
    for js in sorted(RESULTS.glob("*.json")):
        if js.with_suffix(".md").is_file():
            continue
        try:
            data = json.loads(js.read_text(encoding="utf-8"))
            rows = [r for r in data.get("rows", []) if isinstance(r, dict) and "method" in r]
            ctx = (data.get("args") or data.get("meta") or {}).get("context", "")
            svg = _plot_rows(rows, js.stem, ctx) if rows else None
        except Exception:  # noqa: BLE001 - a result file of another shape is skipped
            svg = None
        if svg:
            out.append(f"### Plot: `{js.name}`\n\n<figure class=\"bench-plot\">{svg}</figure>\n")
    return "\n".join(out) if out else "*No benchmark results yet: run `specdec bench` (see below).*\n"


_ROLE_RE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):<code>(~?)([\w.]+)</code>")
_ID_RE = re.compile(r'id="(specdec(?:\.\w+)+)"')


_PAGE_IDS: dict[str, list[str]] = {}  # page src path -> documented object ids (shortest first)


_MATH_RE = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">\s*(?:\\\((?P<inline>.*?)\\\)|\\\[(?P<block>.*?)\\\])\s*</(?P=tag)>', re.S
)


def _mathml(html: str) -> str:
    """Render ``pymdownx.arithmatex`` TeX to MathML at build time: math shows without JavaScript or
    a CDN (browsers render MathML natively). Anything latex2mathml cannot convert is left to MathJax."""
    try:
        from latex2mathml.converter import convert
    except ImportError:  # pragma: no cover - docs extra not installed: MathJax (CDN) renders it
        return html

    def repl(m: re.Match) -> str:
        tex = html_lib.unescape(m.group("inline") if m.group("inline") is not None else m.group("block"))
        tex = re.sub(r"\\text\{([^}]*)\}", lambda t: "\\text{" + t.group(1).replace("\\_", "_") + "}", tex)
        block = m.group("block") is not None
        try:
            out = convert(tex.strip(), display="block" if block else "inline")
        except Exception:  # noqa: BLE001 - any parser failure: keep the TeX for MathJax
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
    try:
        from latex2mathml.converter import convert
    except ImportError:  # pragma: no cover
        return html

    def repl(m: re.Match) -> str:
        block = m.group("block") is not None
        tex = html_lib.unescape(m.group("block") if block else m.group("inline"))
        try:
            out = convert(tex.strip(), display="block" if block else "inline")
        except Exception:  # noqa: BLE001
            return m.group(0)
        return f'<div class="math-block">{out}</div>' if block else out

    parts = _PROTECTED_RE.split(html)
    return "".join(part if i % 2 else _DOLLAR_RE.sub(repl, part) for i, part in enumerate(parts))


def on_page_content(html, page, config, files, **kwargs):
    """Remember which API objects each page documents (used by :func:`on_env`); render math."""
    _PAGE_IDS[page.file.src_path] = sorted(set(_ID_RE.findall(html)), key=len)
    if page.file.src_path.endswith(".ipynb") and "$" in html:
        html = _notebook_mathml(html)
    return _mathml(html) if "arithmatex" in html else html


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
    if "<!-- cli-reference -->" in markdown:
        markdown = markdown.replace("<!-- cli-reference -->", _cli_markdown())
    if "<!-- benchmark-results -->" in markdown:
        markdown = markdown.replace("<!-- benchmark-results -->", _benchmarks_markdown())
    markdown = _API_RE.sub(lambda m: _api_modules(m.group(1), m.group(2).split()), markdown)
    return markdown
