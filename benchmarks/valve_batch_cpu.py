"""Dustin's confidence valve in a batch against each sequence alone (CPU, a tiny random Llama; seconds).

For each margin: whether each of four sequences decoded in one batch equals the same sequence decoded alone, how many
(pass, sequence) pairs the valve re-verified, and the verifier's KV read relative to dense. Before ``a296308`` a
re-run for one sequence rewrote every sequence's K/V rows and history signal (1–4 of 4 sequences differed at margins
0.02–0.2); since, only the sequences that fired are re-verified.

    OMP_NUM_THREADS=1 python benchmarks/valve_batch_cpu.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_tiny  # noqa: E402

from specdec import PipelineConfig, build_engine  # noqa: E402

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 9, [11] * 20, list(range(50, 90))]


def main() -> None:
    m = make_tiny("llama")
    for margin in (None, 0.02, 0.05, 0.1, 0.2, 0.4):
        opts = {} if margin is None else {"margin": margin}
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=8, sinks=2, recent=4, adaptive=False, options=opts)
        eng = build_engine(m, cfg, eos_token_id=-1)
        batch = eng.generate(PROMPTS, max_new_tokens=16)
        alone = [build_engine(m, cfg, eos_token_id=-1).generate([p], max_new_tokens=16).tokens[0] for p in PROMPTS]
        rep = eng.verifier.report()
        print(f"margin {margin}: batch equals alone {[b == a for b, a in zip(batch.tokens, alone)]}, "
              f"re-verified {rep.get('dense_margin')}, KV read vs dense {rep.get('kv_read_vs_dense'):.3f}")


if __name__ == "__main__":
    main()
