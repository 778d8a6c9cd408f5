"""``specdec tune``: Vegas' three-step hyper-parameter search (the Vegas paper, §2C; docs page *Vegas tuner*).

1. **Sparsity sweep** at a fixed γ: τ for each budget ratio; the *plateau* is the smallest ratio whose
   τ is within ``plateau_tol`` of the best τ of the sweep (more budget no longer buys acceptance).
2. **γ sweep** at the plateau ratio: decode tokens/s for each γ; keep the fastest.
3. **Fine sparsity adjustment** at that γ: ratios ``plateau × f`` for the ``fine_factors``; keep the
   fastest (it trades draft latency against acceptance).

Every measurement decodes the same prompts after one shared prefill. Outputs: a JSON report whose
``"recommended"`` key is a pipeline config (``specdec generate --config REPORT``), the same config
alone in ``recommended.json``, and two plots: τ vs sparsity and tokens/s vs γ.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Optional, Sequence

from specdec.errors import SpecdecError
from specdec.outputs import check_output_dir, check_outputs, write_bytes, write_text

#: ``measure(budget_ratio, gamma) -> {"tau": float, "tokens_per_second": float, ...}``
Measure = Callable[[float, int], dict]


def plateau_ratio(taus: dict[float, float], tol: float) -> float:
    """Smallest ratio whose τ is at least ``(1 - tol) · max τ``."""
    best = max(taus.values())
    return min(r for r, t in taus.items() if t >= (1 - tol) * best)


#: how :func:`check_sweeps` names the sweep settings: the Python arguments, or ``specdec tune``'s options
PY_NAMES = dict(sparsities="sparsities", gammas="gammas", gamma0="gamma0", plateau_tol="plateau_tol",
                fine_factors="fine_factors")
CLI_NAMES = dict(sparsities="--sparsities", gammas="--gammas", gamma0="--gamma", plateau_tol="--plateau-tol",
                 fine_factors="--fine")


def gamma_max() -> int:
    """The largest γ a pipeline config takes (``PipelineConfig.gamma``'s upper bound)."""
    from specdec.presets import PipelineConfig

    return next((int(m.le) for m in PipelineConfig.model_fields["gamma"].metadata if getattr(m, "le", None)), 64)


def check_sweeps(sparsities: Sequence[float], gammas: Sequence[int], gamma0: int, plateau_tol: float,
                 fine_factors: Sequence[float], names: dict[str, str] = PY_NAMES) -> None:
    """Refuse, before any measurement, sweeps the search cannot run: ratios outside ``(0, 1]``, γ that are not
    integers from 1 to :func:`gamma_max`, fine factors that are not > 0, a tolerance outside ``[0, 1)``. The
    messages name ``names`` (the Python arguments or the CLI options)."""
    hi = gamma_max()
    if not sparsities or any(not (isinstance(r, (int, float)) and 0 < r <= 1) for r in sparsities):
        raise SpecdecError(f"{names['sparsities']} must be budget ratios in (0, 1] (got "
                           f"{', '.join(f'{r:g}' for r in sparsities) or 'none'}), e.g. {names['sparsities']} "
                           "0.02,0.05,0.1.")
    for name, values in (("gammas", list(gammas)), ("gamma0", [gamma0])):
        if not values:
            raise SpecdecError(f"{names[name]} must list at least one γ, e.g. {names[name]} 2,4,6.")
        for g in values:
            if isinstance(g, bool) or not float(g).is_integer():
                raise SpecdecError(f"{names[name]} must be integers (got {g:g}).")
            if not 1 <= g <= hi:
                raise SpecdecError(f"{names[name]} must be from 1 to {hi} (got {int(g)}), "
                                   f"e.g. {names['gammas']} 2,4,6.")
    if not 0 <= plateau_tol < 1:
        raise SpecdecError(f"{names['plateau_tol']} must be in [0, 1) (got {plateau_tol}).")
    bad = [f for f in fine_factors if not (math.isfinite(f) and f > 0)]
    if bad:
        raise SpecdecError(f"{names['fine_factors']} factors must be > 0 (got {bad[0]:g}); they scale the plateau "
                           f"ratio, e.g. {names['fine_factors']} 0.75,1.25.")


def three_step_search(
    measure: Measure,
    sparsities: Sequence[float],
    gammas: Sequence[int],
    gamma0: int,
    plateau_tol: float = 0.03,
    fine_factors: Sequence[float] = (0.75, 1.25),
    note: Optional[Callable[[str], None]] = None,
    names: dict[str, str] = PY_NAMES,
) -> dict:
    """Run the three steps with ``measure``; returns the report (without plots). A step-3 point past the whole
    cache (plateau × factor > 1) is measured at ratio 1; each such point is told to ``note`` (one line, naming
    ``names['fine_factors']``) and listed in the report's ``notes``.

    Raises:
        SpecdecError: on empty or out-of-range sweeps (:func:`check_sweeps`).
    """
    check_sweeps(sparsities, gammas, gamma0, plateau_tol, fine_factors, names)
    gammas, gamma0 = [int(g) for g in gammas], int(gamma0)
    notes: list[str] = []
    cache: dict[tuple[float, int], dict] = {}

    def run(r: float, g: int) -> dict:
        key = (round(r, 6), g)
        if key not in cache:
            cache[key] = dict(measure(key[0], g), budget_ratio=key[0], gamma=g)
        return cache[key]

    step1 = [run(r, gamma0) for r in sorted(set(sparsities))]
    r_star = plateau_ratio({m["budget_ratio"]: m["tau"] for m in step1}, plateau_tol)
    step2 = [run(r_star, g) for g in sorted(set(gammas))]
    g_star = max(step2, key=lambda m: m["tokens_per_second"])["gamma"]
    fine = {r_star}
    for f in fine_factors:
        r = r_star * f
        if r > 1.0:  # past the whole cache: said, not silently clamped (or dropped when ratio 1 is measured anyway)
            also = (" (the plateau itself, so no new point)" if r_star == 1.0
                    else " (another factor's point already)" if 1.0 in fine else "")
            notes.append(f"{names['fine_factors']} {f:g}: the plateau ratio {r_star:g} × {f:g} = {r:g} exceeds the "
                         f"whole KV cache; step 3 measures ratio 1 instead{also}.")
            r = 1.0
        elif round(r, 6) <= 0:
            notes.append(f"{names['fine_factors']} {f:g}: the plateau ratio {r_star:g} × {f:g} rounds to ratio 0; "
                         "step 3 skips it.")
            continue
        fine.add(r)
    for line in notes:
        if note is not None:
            note(line)
    step3 = [run(r, g_star) for r in sorted(fine)]
    best = max(step3, key=lambda m: m["tokens_per_second"])
    return dict(
        steps=dict(sparsity_sweep=step1, gamma_sweep=step2, fine_sparsity=step3),
        plateau_ratio=r_star,
        recommended=dict(gamma=g_star, budget_ratio=best["budget_ratio"]),
        best=best,
        notes=notes,
    )


def engine_measure(model, prompts: list[list[int]], method: str, max_new_tokens: int,
                   min_budget: int = 0, sinks: int = 4, recent: int = 16, options: dict | None = None) -> Measure:
    """A :data:`Measure` decoding ``prompts`` greedily with ``method`` after one shared prefill."""
    from specdec.presets import PipelineConfig, build_engine

    from specdec.prompts import check_positions

    d = model.dims
    L = max(len(p) for p in prompts)
    check_positions(L, max_new_tokens, d.max_positions, "context_tokens=")  # before the prefill, not after it
    dense = build_engine(model, PipelineConfig.make(method="dense"), eos_token_id=-1)
    pre = dense.prefill(prompts)

    def measure(ratio: float, gamma: int) -> dict:
        # fixed γ: the sweep measures τ and speed at this γ (the adaptive controller would move it)
        cfg = PipelineConfig.make(method=method, gamma=gamma, budget_ratio=ratio, min_budget=min_budget,
                                  sinks=sinks, recent=recent, options=options or {}, adaptive=False)
        eng = build_engine(model, cfg, eos_token_id=-1)
        st = eng.generate(prompts, max_new_tokens=max_new_tokens, prefilled=pre).stats
        # bytes a draft step reads over a dense step's: the budget applies to global layers only, a
        # sliding-window layer reads its window either way (DESIGN.md §6, per-layer attention types)
        budget = cfg.budget_kwargs().get("budget") or max(min_budget, int(ratio * L + 0.999999))
        local = sum(min(w, L) for w in d.windows if w is not None)
        return dict(tau=st.mean_accepted_length, tokens_per_second=st.tokens_per_second,
                    selection_overhead_share=st.selection_overhead_share,
                    draft_kv_share=(d.n_global * min(budget, L) + local) / (d.n_global * L + local))

    return measure


def plot_report(report: dict, out_dir: Path) -> list[str]:
    """Write ``tau_vs_sparsity.png`` and ``tokens_per_second_vs_gamma.png``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s1 = report["steps"]["sparsity_sweep"]
    s2 = report["steps"]["gamma_sweep"]
    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([m["budget_ratio"] for m in s1], [m["tau"] for m in s1], "o-")
    ax.axvline(report["plateau_ratio"], color="gray", ls="--", label="plateau")
    ax.set_xlabel("budget ratio (share of the KV cache)")
    ax.set_ylabel("τ (tokens / iteration)")
    ax.set_title(f"{report.get('method', '')}: τ vs sparsity (γ={s1[0]['gamma']})")
    ax.legend()
    fig.tight_layout()
    paths.append(str(out_dir / "tau_vs_sparsity.png"))
    _save_png(fig, paths[-1])
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([m["gamma"] for m in s2], [m["tokens_per_second"] for m in s2], "o-")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # γ is a whole number of tokens
    ax.set_xlabel("γ (draft length)")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{report.get('method', '')}: throughput vs γ (ratio {report['plateau_ratio']:g})")
    fig.tight_layout()
    paths.append(str(out_dir / "tokens_per_second_vs_gamma.png"))
    _save_png(fig, paths[-1])
    plt.close(fig)
    return paths


def _save_png(fig, path: str) -> None:  # noqa: ANN001 - matplotlib figure
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes(path, buf.getvalue(), "--output-dir")


#: the files ``write_report`` writes under its folder
REPORT_FILES = ("recommended.json", "tune_report.json", "tau_vs_sparsity.png", "tokens_per_second_vs_gamma.png")


def check_report_dir(out_dir: Path) -> None:
    """Refuse, before any model work, an output folder (or a file in it) that cannot be written."""
    check_output_dir(out_dir, "--output-dir")
    check_outputs([(out_dir / name, "--output-dir") for name in REPORT_FILES])


def write_report(report: dict, out_dir: Path, plots: bool = True) -> Path:
    """Write ``tune_report.json`` (+ ``recommended.json`` and the plots) under ``out_dir``, each atomically."""
    check_report_dir(out_dir)
    if plots:
        report["plots"] = plot_report(report, out_dir)
    write_text(out_dir / "recommended.json", json.dumps(report["recommended"], indent=2), "--output-dir")
    path = out_dir / "tune_report.json"
    write_text(path, json.dumps(report, indent=2), "--output-dir")
    return path


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecdecError(f"{name} must be comma-separated numbers (got {text!r}).") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise SpecdecError(f"{name} must be comma-separated finite numbers (got {text!r}).")
    return values


def tunable_methods() -> list[str]:
    """The methods ``specdec tune`` searches: the sparse self-speculative ones (lossless, a draft that reads a budget
    of the KV cache), i.e. every registered method but ``dense`` and the near-lossless draft-model ones (Dustin)."""
    from specdec.presets import get_method, method_names

    return [n for n in method_names() if n != "dense" and get_method(n).lossless]


def check_method(method: str) -> None:
    """Refuse a method the tuner cannot search (an unknown one lists the known ones)."""
    from specdec.presets import get_method

    spec = get_method(method)
    if method in tunable_methods():
        return
    why = ("has no sparsity or γ to tune" if method == "dense"
           else f"is not a sparse self-speculative method ({spec.description})")
    raise SpecdecError(f"--method {method} {why}; tune supports {', '.join(tunable_methods())}.")


def register(app) -> None:  # noqa: ANN001 - typer app
    """Add ``specdec tune`` to the CLI (called by :mod:`specdec.cli`)."""
    import typer

    from specdec.friendly import friendly
    from specdec.loading import load_model

    @app.command()
    @friendly
    def tune(
        output_dir: Path = typer.Option(Path("tune_out"), "--output-dir", help="where the report, config and plots go"),
        method: str = typer.Option("vegas", "--method", help="a sparse self-speculative method (vegas, vegas-all, vegas-last, magicdec, quest)"),
        document: Optional[str] = typer.Option(None, "--document", help="pydoc (the default) or stdlib:<module>; "
                                               "not read with --prompt-file"),
        prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="plain-text prompt instead of a document"),
        context_tokens: int = typer.Option(2048, "--context-tokens", min=16, help="prompt length in tokens"),
        max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=2, help="tokens generated per measurement"),
        sparsities: str = typer.Option("0.02,0.05,0.1,0.2", "--sparsities", help="budget ratios of step 1"),
        gammas: str = typer.Option("2,4,6,8", "--gammas", help="draft lengths of step 2"),
        gamma: int = typer.Option(4, "--gamma", help="γ used by step 1"),
        fine: str = typer.Option("0.75,1.25", "--fine", help="factors around the plateau ratio for step 3"),
        plateau_tol: float = typer.Option(0.03, "--plateau-tol", help="τ within this share of the best = plateau"),
        min_budget: int = typer.Option(0, "--min-budget", help="floor of the ratio budget, in KV entries"),
        model: str = typer.Option("smollm2-135m", "--model", help="embedded name, local dir, .gguf file or cached hub id"),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
        backend: str = typer.Option("reference", "--backend", help="attention backend: reference, torch, triton, numba, ..."),
        dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16"),
        encoding: str = typer.Option("utf-8", "--encoding", help="text encoding of --prompt-file"),
    ) -> None:
        """Find the budget ratio and γ of a sparse self-speculative method (Vegas' three steps)."""
        from specdec.data import check_documents, context_ids, load_document
        from specdec.inputs import read_text_file
        from specdec.prompts import check_positions

        check_method(method)
        sp, gm, ff = _floats(sparsities, "--sparsities"), _floats(gammas, "--gammas"), _floats(fine, "--fine")
        check_sweeps(sp, gm, gamma, plateau_tol, ff, CLI_NAMES)  # before the model loads, not after steps 1-2
        if min_budget < 0:
            raise SpecdecError(f"--min-budget must be >= 0 (got {min_budget}).")
        check_report_dir(output_dir)
        notes = []
        if prompt_file is not None:
            if document is not None:
                notes.append(f"--document {document} does not apply with --prompt-file (the prompt file is the text "
                             "tuned on); leave one out.")
            text = read_text_file(prompt_file, "--prompt-file", encoding, "--encoding")
            if not text.strip():
                raise SpecdecError(f"prompt file {prompt_file} is empty; give it some text.")
        else:
            notes += check_documents([document], "--document") if document is not None else []
            text = load_document(document or "pydoc")
        m = load_model(model, dtype, device, backend)
        ids = context_ids(m.tokenizer, text, None)[-context_tokens:]
        if len(ids) < context_tokens:
            notes.append(f"the {'prompt file' if prompt_file is not None else 'document'} has {len(ids)} tokens, "
                         f"fewer than --context-tokens {context_tokens}; tuning on all {len(ids)} (a budget ratio is "
                         "a share of this context).")
        for line in notes:
            typer.echo(f"note: {line}", err=True)
        check_positions(len(ids), max_new_tokens, m.dims.max_positions, "--context-tokens")  # before the prefill
        if min_budget >= len(ids):
            raise SpecdecError(f"--min-budget {min_budget} is not below the context of {len(ids)} tokens: every draft "
                               f"would see the whole cache (dense), leaving nothing to tune; pass --min-budget below "
                               f"{len(ids)} (or 0).")
        measure = engine_measure(m, [ids], method, max_new_tokens, min_budget=min_budget)
        report = three_step_search(measure, sp, gm, gamma, plateau_tol, ff,
                                   note=lambda line: typer.echo(f"note: {line}", err=True), names=CLI_NAMES)
        report["notes"] = notes + report["notes"]
        report.update(method=method, model=model, context_tokens=len(ids), max_new_tokens=max_new_tokens,
                      source=str(prompt_file) if prompt_file else document or "pydoc",
                      layout=dict(layers=m.dims.n_layers, global_layers=m.dims.global_layers,
                                  windows=sorted({w for w in m.dims.windows if w is not None})))
        report["recommended"] = dict(method=method, **report["recommended"], min_budget=min_budget)
        path = write_report(report, output_dir)
        r = report["recommended"]
        typer.echo(f"plateau at ratio {report['plateau_ratio']:g}; recommended γ={r['gamma']}, "
                   f"budget_ratio={r['budget_ratio']:g} → {path} (use: specdec generate --config {path})")
