"""The benchmarks pages, generated from ``benchmarks/results`` at build time (used by ``specdec_docs.py``).

* :func:`summary_markdown` — ONE table a reader can act on: tokens/s per method and shape (machine, context,
  batch) from one run per shape (interleaved first, then most methods: :func:`summary_rows`), each cell with its speed-up
  over dense *measured in the same run*, and below it the run each number comes from (date, machine, command,
  documents).
* :func:`summary_plot` — the same numbers as a bar chart (inline SVG).
* :func:`runs_markdown` — every report ``benchmarks/results/*.md`` (and a plot per JSON file), for the
  "All runs" page. Reports are cleaned on the way: headings demoted, tables without rows dropped,
  build-machine paths shortened to file names, raw exception reprs cut to their first words.

End-to-end results are recognised in two shapes: ``specdec bench`` (``meta.command``, ``meta.machine``,
rows with ``context``/``batch``) and ``benchmarks/e2e_gpu.py`` (``args``, ``gpu``, ``date``, rows with
``B``). A row whose method is lossless but whose tokens differ from dense never counts.
"""

from __future__ import annotations

import base64
import collections
import io
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from statistics import geometric_mean

# -- reading the end-to-end results --------------------------------------------------------------------

METHOD_ORDER = ["hf-generate", "hf-generate-static", "dense", "magicdec", "vegas", "vegas@logits", "vegas-all", "vegas-last",
                "quest", "dustin", "dustin (dense's text)"]
LABEL = {"hf-generate": "HF generate", "hf-generate-static": "HF generate, static cache"}
#: names one model goes by in result files: the embedded model's GGUF file as the benchmark machines name it
#: (``smol.gguf``: the file carried to the GPU in parts and joined there; the package's own file name) and its
#: embedded name; one column per model, not per file name
MODEL_ALIASES = {"smol.gguf": "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf": "smollm2-135m"}
# paths on the machine a benchmark ran on (model files, output folders): shown as their file name
_MACHINE_PATH_RE = re.compile(r"(?<![\w./-])/(?:tmp|root|work|home|opt|mnt|data|scratch)(?:/[\w.@+-]+)+")


@dataclass
class Run:
    """One end-to-end results file."""

    source: str  # file name in benchmarks/results
    date: str
    machine: str
    command: str
    rows: list[dict] = field(default_factory=list)  # normalised: method, context, batch, tps, vs_dense, tau, same
    documents: list[str] = field(default_factory=list)  # what the rows decoded (file names), in order
    paired: bool = False  # specdec bench --interleave: speed-ups from runs alternated with dense's
    tensor_parallel: int = 1  # specdec bench --tp N: the model split over N devices (Scale-out page, not the summary)


def scrub_paths(text: str) -> str:
    """``/tmp/m/smol.gguf`` → ``smol.gguf``: paths of the build or benchmark machine mean nothing to a reader."""
    return _MACHINE_PATH_RE.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


def _e2e_gpu_command(args: dict) -> str:
    parts = ["python3 benchmarks/e2e_gpu.py"]
    for key, value in args.items():
        if key == "out":
            continue
        parts.append(f"--{key.replace('_', '-')} {shlex.quote(scrub_paths(str(value)))}")
    return " ".join(parts)


def _same(row: dict) -> bool | float | None:
    """True/False for a greedy comparison with dense, a share for near-lossless methods, None if unknown."""
    if "same_tokens_as_dense" in row:
        return row["same_tokens_as_dense"]
    agree = row.get("token_agreement_with_dense")
    if agree is None:
        return None
    return True if agree == 1.0 else float(agree)


def load_run(path: Path) -> Run | None:
    """A :class:`Run` for an end-to-end results file, None for any other JSON (kernels, studies, ...)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return None
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    rows = []
    if isinstance(meta.get("machine"), dict) and "command" in meta:  # specdec bench
        machine = meta["machine"]
        name = machine.get("gpu") or f"CPU ({machine.get('cpu', '?')}, {machine.get('threads', '?')} thread{'' if machine.get('threads') == 1 else 's'})"
        model = scrub_paths(str(meta.get("model", "?")))  # a GGUF path: its name
        model = f"{MODEL_ALIASES.get(model, model)} {meta.get('dtype') or ''}".strip()
        run = Run(path.name, str(machine.get("date", "")), f"{name} · {model}", scrub_paths(meta["command"]),
                  paired=bool(meta.get("interleave")), tensor_parallel=int(meta.get("tensor_parallel") or 1))
        for r in data["rows"]:
            if isinstance(r, dict) and {"method", "context", "batch", "tokens_per_second"} <= r.keys():
                # a near-lossless method timed on dense's text (bench --dense-text) is a row of its own
                method = f"{r['method']} (dense's text)" if r.get("dense_text") else r["method"]
                doc = scrub_paths(str(r.get("document", "")))
                if doc and doc not in run.documents:
                    run.documents.append(doc)
                rows.append(dict(method=method, context=r["context"], batch=r["batch"],
                                 tps=r["tokens_per_second"], vs_dense=r.get("speedup_vs_dense"),
                                 tau=r.get("tau"), same=_same(r), lossless=r.get("lossless", True)))
    elif isinstance(data.get("args"), dict) and "gpu" in data:  # benchmarks/e2e_gpu.py
        args = data["args"]
        run = Run(path.name, str(data.get("date", "")), f"{data['gpu']} · smollm2-135m bfloat16", _e2e_gpu_command(args))
        for r in data["rows"]:
            if isinstance(r, dict) and {"method", "B", "tokens_per_second"} <= r.keys():
                rows.append(dict(method=r["method"], context=args.get("context"), batch=r["B"],
                                 tps=r["tokens_per_second"], vs_dense=r.get("speedup_vs_dense"),
                                 tau=r.get("tau"), same=_same(r), lossless=r["method"] != "dustin"))
    else:
        return None
    run.rows = rows
    return run if rows else None


def _merged(rows: list[dict]) -> dict:
    """One cell from a run's rows of one method and shape (one per document): the geometric mean of their tokens/s
    and of their speed-ups over dense (each measured against dense on its own document), the worst agreement."""
    if len(rows) == 1:
        return dict(rows[0], documents=1)
    ratios = [r["vs_dense"] for r in rows]
    sames = [r["same"] for r in rows]
    if any(x is None for x in sames):
        same = None
    elif any(x is False for x in sames):  # a document whose tokens differ from dense (no share known)
        same = False
    elif all(x is True for x in sames):
        same = True
    else:  # shares of positions equal to dense (near-lossless methods): the worst document's
        same = min(1.0 if x is True else float(x) for x in sames)
    return dict(rows[0], tps=geometric_mean([r["tps"] for r in rows]), tau=None, same=same, documents=len(rows),
                vs_dense=geometric_mean(ratios) if all(x is not None and x > 0 for x in ratios) else None)


def summary_rows(runs: list[Run]) -> list[tuple[dict, Run]]:
    """The summary's cells, one per (machine, context, batch, method), each from ONE run that timed dense at that
    shape (so its speed-up is measured in the same run).

    Per shape, the column's run is an interleaved one (``bench --interleave``: each speed-up is the median of runs
    alternated with dense's, so a drift of the machine falls on both) before one that is not, then the one that timed
    the most methods there, then the newest; each of its methods' cells comes from it: the geometric mean over the
    documents it decoded. A method it did not time
    comes from the newest other run that did. A lossless method whose tokens differ from dense is a bug, not a
    result: such a row never counts (nor does its run for that method)."""
    by_shape: dict[tuple, list[tuple[Run, dict[str, list[dict]]]]] = {}
    for run in runs:
        if run.tensor_parallel > 1:  # a model split over several devices: the Scale-out page reads those runs
            continue
        shapes: dict[tuple, dict[str, list[dict]]] = {}
        for r in run.rows:
            shapes.setdefault((run.machine, r["context"], r["batch"]), {}).setdefault(r["method"], []).append(r)
        for shape, methods in shapes.items():
            valid = {m: rs for m, rs in methods.items() if not any(r["lossless"] and r["same"] is False for r in rs)}
            if "dense" in valid:
                by_shape.setdefault(shape, []).append((run, valid))
    picked: list[tuple[dict, Run]] = []
    for shape, cands in by_shape.items():
        cands.sort(key=lambda c: (c[0].paired, len(c[1]), c[0].date, c[0].source), reverse=True)
        newest = sorted(cands, key=lambda c: (c[0].date, c[0].source), reverse=True)
        done = set()
        for run, methods in [cands[0]] + newest:
            for m, rs in methods.items():
                if m not in done:
                    done.add(m)
                    picked.append((_merged(rs), run))
    return picked


def _method_key(m: str) -> tuple:
    return (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m)


def summary_parts(results: Path) -> tuple[str, str]:
    """``(table, runs)``: the table of tokens/s per method (rows) and shape (columns) (:func:`summary_rows`) with its
    legend, and the numbered list of the runs its cells cite (date, machine, file, command)."""
    runs = [r for p in sorted(results.glob("*.json")) if (r := load_run(p))]
    picked = summary_rows(runs)
    if not picked:
        return "*No end-to-end results yet: run `specdec bench` (see below).*\n", ""
    methods = sorted({r["method"] for r, _ in picked}, key=_method_key)
    # GPUs before the CPU, the most-measured machine first (a machine lent once for one run goes after it)
    cells = collections.Counter(run.machine for _, run in picked)
    shapes = sorted({(run.machine, r["context"], r["batch"]) for r, run in picked},
                    key=lambda s: ("CPU" in s[0], -cells[s[0]], s[0], -int(s[1] or 0), -int(s[2] or 0)))
    cell = {(run.machine, r["context"], r["batch"], r["method"]): (r, run) for r, run in picked}
    sources: list[str] = []  # run file names, in order of first use

    def ref(run: Run) -> str:
        if run.source not in sources:
            sources.append(run.source)
        return f"<sup>[{sources.index(run.source) + 1}]</sup>"

    def device(machine: str) -> str:
        return machine.split(" · ")[0].replace("NVIDIA ", "").split(" (")[0]

    devices = [device(m) for m in dict.fromkeys(m for m, _, _ in shapes)]

    def short(machine: str, sep: str = "<br>") -> str:
        """The device, and the model too where runs of several models share that device (H200 · smol.gguf)."""
        d = device(machine)
        if devices.count(d) > 1 and " · " in machine:
            return f"{d}{sep}{machine.split(' · ')[1].rsplit(' ', 1)[0]}"
        return d

    def ctx_label(ctx) -> str:
        if isinstance(ctx, int) and ctx and ctx % 1024 == 0:
            return f"{ctx // 1024}k"
        return f"{ctx // 1000}k" if isinstance(ctx, int) and ctx and ctx % 1000 == 0 else str(ctx)

    # one column per shape (machine, context, batch), one row per method: narrow enough for a page
    head = "| method | " + " | ".join(f"{short(m)}<br>{ctx_label(c)}&nbsp;ctx<br>B&nbsp;=&nbsp;{b}" for m, c, b in shapes) + " |"
    out = [head, "|---|" + "---:|" * len(shapes)]
    for m in methods:
        cells = []
        for machine, ctx, batch in shapes:
            got = cell.get((machine, ctx, batch, m))
            if got is None:
                cells.append("")
                continue
            r, run = got
            text = f"{r['tps']:,.0f}" if r["tps"] >= 100 else f"{r['tps']:.3g}"
            if r.get("documents", 1) > 1:
                text += f"&nbsp;⌀{r['documents']}"
            if m == "dense":
                text = f"**{text}**"
            elif r["vs_dense"] is not None and m != "hf-generate":
                text += f"<br>{r['vs_dense']:.2f}×"
            if isinstance(r["same"], float):
                text += f" ‡{r['same']:.0%}"
            cells.append(text + " " + ref(run))
        out.append(f"| {LABEL.get(m, m)} | " + " | ".join(cells) + " |")
    out.append("")
    machines = list(dict.fromkeys(m for m, _, _ in shapes))
    out.append("Machines: " + "; ".join(f"**{short(m, ' · ')}** = {m}" for m in machines) + ".\n")
    out.append("")
    out.append("Tokens per second for the whole batch (B sequences of the same context), under each the "
               "speed-up over **dense decoding in the same run** (compare within a column). A column's numbers come "
               "from one run per shape: an interleaved `specdec bench` run (each speed-up the median over runs "
               "alternated with dense's) before others, then the run that timed the most methods there, then the "
               "newest; a method it did not time comes from the newest run that did; ⌀N marks the geometric mean over the N documents that run "
               "decoded, each speed-up taken against dense on its own document. Every lossless method produced exactly the dense tokens "
               "in the runs counted here; ‡ marks a near-lossless method (Dustin's sparse verification) "
               "with the share of positions equal to dense.\n")
    by_name = {run.source: run for run in runs}
    runs_md = ["The runs the numbers come from (files in `benchmarks/results/`; the full reports are on "
               "[All benchmark runs](benchmark-runs.md)):\n"]
    for i, name in enumerate(sources, 1):
        run = by_name[name]
        how = f"`{run.command}`" if run.command.strip() else "(`run_bench` called by a script: its report names the command)"
        docs = f"  \n   documents: {', '.join(f'`{d}`' for d in run.documents)}" if run.documents else ""
        runs_md.append(f"{i}. {run.date} · {run.machine} · `{name}`  \n   {how}{docs}")
    runs_md.append("")
    return "\n".join(out), "\n".join(runs_md)


def summary_markdown(results: Path) -> str:
    """The summary table with its legend (:func:`summary_parts` gives the list of runs separately)."""
    table, runs = summary_parts(results)
    return table + ("\n" + runs if runs else "")


def summary_plot(results: Path) -> str | None:
    """Bar chart of the summary's GPU rows (tokens/s, log scale): one group per batch size."""
    runs = [r for p in sorted(results.glob("*.json")) if (r := load_run(p))]
    rows = [dict(r, machine=run.machine) for r, run in summary_rows(runs)]
    machines = sorted({r["machine"] for r in rows}, key=lambda m: "CPU" in m)
    if not machines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(machines), figsize=(5.5 * len(machines), 3.4), squeeze=False)
    for ax, machine in zip(axes[0], machines):
        mine = [r for r in rows if r["machine"] == machine]
        shapes = sorted({(r["context"], r["batch"]) for r in mine}, key=lambda s: (-s[0], -s[1]))
        methods = sorted({r["method"] for r in mine}, key=_method_key)
        width = 0.8 / len(methods)
        value = {(r["context"], r["batch"], r["method"]): r["tps"] for r in mine}
        for i, m in enumerate(methods):
            ys = [value.get((c, b, m), float("nan")) for c, b in shapes]
            ax.bar([j + i * width for j in range(len(shapes))], ys, width, label=LABEL.get(m, m))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], [f"ctx {c}\nB = {b}" for c, b in shapes], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("tokens / s (log scale)", fontsize=8)
        ax.set_title(machine, fontsize=9)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return svg_of(fig)


def svg_of(fig) -> str:
    """A matplotlib figure as an inline ``<svg>`` element (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


# -- every report, cleaned ---------------------------------------------------------------------------------

_LINK_RE = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
_EXC_RE = re.compile(r"(?:error: )?(\w+(?:Error|Exception))\('([^\\'\n]{0,80})[^|\n]*")
_TABLE_RE = re.compile(r"((?:^\|.*\|[ \t]*\n)+)", re.M)


def _local_link(m: re.Match, base: Path, root: Path) -> str:
    """Links inside an included report point next to it, outside docs/: inline images as data URIs,
    other relative targets shown as a path (a broken link would fail the strict build)."""
    bang, label, target = m.groups()
    if re.match(r"^[a-z]+:|^#", target):
        return m.group(0)
    path = (base / target).resolve()
    mime = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}.get(path.suffix.lower())
    if bang and mime and path.is_file():
        return f"![{label}](data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()})"
    try:
        shown = path.relative_to(root)
    except ValueError:
        shown = Path(target)
    return f"{label} (`{shown}`)"


def drop_empty_tables(text: str) -> str:
    """Remove Markdown tables that have a header and no rows (a run that measured nothing there)."""

    def repl(m: re.Match) -> str:
        lines = m.group(1).splitlines()
        if len(lines) <= 2 and all(set(c.strip()) <= set("-: ") for c in lines[-1].strip("|").split("|")):
            return ""
        return m.group(1)

    return _TABLE_RE.sub(repl, text)


def clean_report(text: str) -> str:
    """A report as the site shows it: no machine paths, no raw exception reprs, no empty tables."""
    text = scrub_paths(text)
    text = _EXC_RE.sub(lambda m: f"failed: {m.group(1)} ({m.group(2).split(':')[0].strip()})", text)
    text = drop_empty_tables(text)
    return re.sub(r"\n{3,}", "\n\n", text)


_INTERNAL_RE = re.compile(r"\b[Ii]ssue \d+\b|\bthe issue's\b|\b[Ff]ixed in [0-9a-f]{7,40}\b")


def internal_wording(text: str) -> list[str]:
    """Phrases that mean something only to the project's own tracker (issue numbers, commit ids)."""
    return sorted(set(_INTERNAL_RE.findall(text)))


def runs_markdown(results: Path, root: Path, plot_rows) -> str:
    """Every report in ``results`` (demoted below the page's headings) and a plot per results JSON."""
    if not results.is_dir():
        return "*No benchmark results yet.*\n"
    out = []
    for md in sorted(results.glob("*.md")):
        text = md.read_text(encoding="utf-8")
        text = re.sub(r"^(#+)", r"#\1", text, flags=re.M)
        text = _LINK_RE.sub(lambda m: _local_link(m, md.parent, root), text)
        out.append(clean_report(text))
        out.append(f"*Source: `benchmarks/results/{md.name}`.*\n")
        js = md.with_suffix(".json")
        if js.is_file():
            svg = _plot_json(js, plot_rows)
            if svg:
                out.append(f'<figure class="bench-plot">{svg}</figure>\n')
    for js in sorted(results.glob("*.json")):
        if js.with_suffix(".md").is_file():
            continue
        svg = _plot_json(js, plot_rows)
        if svg:
            out.append(f"## Plot: `{js.name}`\n\n<figure class=\"bench-plot\">{svg}</figure>\n")
    return "\n".join(out) if out else "*No benchmark results yet.*\n"


def _plot_json(js: Path, plot_rows) -> str | None:
    try:
        data = json.loads(js.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    rows = [r for r in data.get("rows", []) if isinstance(r, dict) and "method" in r and "tau" in r
            and isinstance(r.get("tokens_per_second"), (int, float)) and r["tokens_per_second"] > 0]
    if not rows:
        return None
    ctx = (data.get("args") or data.get("meta") or {}).get("context", "")
    return plot_rows(rows, js.stem, ctx)
