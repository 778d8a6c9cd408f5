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


def three_step_search(
    measure: Measure,
    sparsities: Sequence[float],
    gammas: Sequence[int],
    gamma0: int,
    plateau_tol: float = 0.03,
    fine_factors: Sequence[float] = (0.75, 1.25),
) -> dict:
    """Run the three steps with ``measure``; returns the report (without plots).

    Raises:
        SpecdecError: on empty or out-of-range sweeps.
    """
    if not sparsities or any(not 0 < r <= 1 for r in sparsities):
        raise SpecdecError("sparsities must be budget ratios in (0, 1], e.g. --sparsities 0.02,0.05,0.1.")
    if not gammas or any(g < 1 for g in gammas) or gamma0 < 1:
        raise SpecdecError("gammas and --gamma must be >= 1, e.g. --gammas 2,4,6.")
    if not 0 <= plateau_tol < 1:
        raise SpecdecError(f"plateau_tol must be in [0, 1) (got {plateau_tol}).")
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
    fine = sorted({r_star} | {min(1.0, r_star * f) for f in fine_factors})
    step3 = [run(r, g_star) for r in fine]
    best = max(step3, key=lambda m: m["tokens_per_second"])
    return dict(
        steps=dict(sparsity_sweep=step1, gamma_sweep=step2, fine_sparsity=step3),
        plateau_ratio=r_star,
        recommended=dict(gamma=g_star, budget_ratio=best["budget_ratio"]),
        best=best,
    )


def engine_measure(model, prompts: list[list[int]], method: str, max_new_tokens: int,
                   min_budget: int = 0, sinks: int = 4, recent: int = 16, options: dict | None = None) -> Measure:
    """A :data:`Measure` decoding ``prompts`` greedily with ``method`` after one shared prefill."""
    from specdec.presets import PipelineConfig, build_engine

    dense = build_engine(model, PipelineConfig.make(method="dense"), eos_token_id=-1)
    pre = dense.prefill(prompts)
    d = model.dims
    L = max(len(p) for p in prompts)

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


def register(app) -> None:  # noqa: ANN001 - typer app
    """Add ``specdec tune`` to the CLI (called by :mod:`specdec.cli`)."""
    import typer

    from specdec.friendly import friendly
    from specdec.loading import load_model

    @app.command()
    @friendly
    def tune(
        output_dir: Path = typer.Option(Path("tune_out"), "--output-dir", help="where the report, config and plots go"),
        method: str = typer.Option("vegas", "--method", help="a sparse self-speculative method (vegas, magicdec, quest, ...)"),
        document: str = typer.Option("pydoc", "--document", help="pydoc or stdlib:<module> (ignored with --prompt-file)"),
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
        from specdec.data import context_ids, load_document
        from specdec.inputs import read_text_file
        from specdec.presets import get_method

        get_method(method)
        if method == "dense":
            raise SpecdecError("--method dense has no sparsity or γ to tune; pick vegas, magicdec or quest.")
        sp, gm, ff = _floats(sparsities, "--sparsities"), [int(x) for x in _floats(gammas, "--gammas")], _floats(fine, "--fine")
        check_report_dir(output_dir)
        if prompt_file is not None:
            text = read_text_file(prompt_file, "--prompt-file", encoding, "--encoding")
            if not text.strip():
                raise SpecdecError(f"prompt file {prompt_file} is empty; give it some text.")
        else:
            text = load_document(document)
        m = load_model(model, dtype, device, backend)
        ids = context_ids(m.tokenizer, text, None)[-context_tokens:]
        measure = engine_measure(m, [ids], method, max_new_tokens, min_budget=min_budget)
        report = three_step_search(measure, sp, gm, gamma, plateau_tol, ff)
        report.update(method=method, model=model, context_tokens=len(ids), max_new_tokens=max_new_tokens,
                      source=str(prompt_file) if prompt_file else document,
                      layout=dict(layers=m.dims.n_layers, global_layers=m.dims.global_layers,
                                  windows=sorted({w for w in m.dims.windows if w is not None})))
        report["recommended"] = dict(method=method, **report["recommended"], min_budget=min_budget)
        path = write_report(report, output_dir)
        r = report["recommended"]
        typer.echo(f"plateau at ratio {report['plateau_ratio']:g}; recommended γ={r['gamma']}, "
                   f"budget_ratio={r['budget_ratio']:g} → {path} (use: specdec generate --config {path})")
