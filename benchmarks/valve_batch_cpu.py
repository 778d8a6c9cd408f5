"""Dustin's confidence valve in a batch against each sequence alone (CPU; a tiny random Llama in seconds, or the
embedded SmolLM2 on windows of three documents with ``--real``).

For each margin: whether each of four sequences decoded in one batch equals the same sequence decoded alone, how many
(pass, sequence) pairs the valve re-verified, and the verifier's KV read relative to dense. Before ``a296308`` a
re-run for one sequence rewrote every sequence's K/V rows and history signal (1–4 of 4 sequences differed at margins
0.02–0.2); since, only the sequences that fired are re-verified.

    OMP_NUM_THREADS=1 python benchmarks/valve_batch_cpu.py
    OMP_NUM_THREADS=1 python benchmarks/valve_batch_cpu.py --real --context 1024 --new 48 --margins 0.5,1.0
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_tiny  # noqa: E402

from specdec import PipelineConfig, build_engine  # noqa: E402

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 9, [11] * 20, list(range(50, 90))]


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--real", action="store_true", help="the embedded SmolLM2-135M, windows of pydoc / argparse / typing")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--margins", default=None, help="comma-separated (default: none, 0.02, 0.05, 0.1, 0.2, 0.4)")
    a = ap.parse_args()
    if a.real:
        from conftest import real_prompts

        from specdec.loading import load_model

        m = load_model("smollm2-135m", "float32", "cpu", "reference")
        prompts, new = real_prompts(m.tokenizer, a.context, 3), a.new
        budget = dict(budget_ratio=0.25)
    else:
        m, prompts, new, budget = make_tiny("llama"), PROMPTS, 16, dict(budget=8, sinks=2, recent=4)
    margins = [None if x == "none" else float(x) for x in a.margins.split(",")] if a.margins else \
        [None, 0.02, 0.05, 0.1, 0.2, 0.4]
    for margin in margins:
        opts = {} if margin is None else {"margin": margin}
        cfg = PipelineConfig.make(method="dustin", gamma=3 if not a.real else 4, adaptive=False, options=opts, **budget)
        eng = build_engine(m, cfg, eos_token_id=-1)
        batch = eng.generate(prompts, max_new_tokens=new)
        alone = [build_engine(m, cfg, eos_token_id=-1).generate([p], max_new_tokens=new).tokens[0] for p in prompts]
        rep = eng.verifier.report()
        print(f"margin {margin}: batch equals alone {[b == a for b, a in zip(batch.tokens, alone)]}, "
              f"re-verified {rep.get('dense_margin')}, KV read vs dense {rep.get('kv_read_vs_dense'):.3f}")


if __name__ == "__main__":
    main()
