"""Are a batch of 32 and a batch of 64 the same numerics? (the token check of ``overlap14.py``)

Dense and Vegas at B 64 and at B 32 (one after the other, one stream, two copies of the model) on four windows of
click's ``core.py`` (8k, 96 new tokens, γ 4 fixed, 5 % budget, bf16, Triton, fused, CUDA graphs): whether B 32's
sequences equal B 64's first 32 (sequence ``b`` continues window ``b % 4`` in both), and whether Vegas equals dense at
each batch size. Prints one line per method.

    PYTHONPATH=$PWD:/tmp/site python3 benchmarks/gpu/ovcheck14.py   # model at /tmp/m/smol.gguf, documents in .heldout
"""

from specdec.bench import _prefilled
from specdec.data import context_windows, load_document
from specdec.loading import load_model, pipeline_config
from specdec.presets import build_engine


def main() -> None:
    ms = [load_model("/tmp/m/smol.gguf", "bfloat16", "cuda", "triton", cuda_graphs=True, compile=False, fuse=True)
          for _ in range(2)]
    wins = context_windows(ms[0].tokenizer, load_document(".heldout/click_core.py"), 8000, 4, 112, 800)
    dense = {}
    for method in ("dense", "vegas"):
        cfg = pipeline_config(method, 4, None, 0.05, 0.0, 1.0, 0, None)
        e64, e32 = build_engine(ms[0], cfg, adaptive=False), build_engine(ms[1], cfg, adaptive=False)
        p64, p32 = _prefilled(e64, ms[0], wins, 64, False), _prefilled(e32, ms[1], wins, 32, False)
        t64 = e64.generate(p64.ids, max_new_tokens=96, prefilled=p64).tokens
        t32 = e32.generate(p32.ids, max_new_tokens=96, prefilled=p32).tokens
        row = dict(b32_equals_b64_first_half=t32 == t64[:32], b64_halves_equal=t64[:32] == t64[32:],
                   differing=[b for b in range(32) if t32[b] != t64[b]])
        if method == "dense":
            dense = dict(b64=t64, b32=t32)
        else:
            row["vs_dense_same_batch"] = dict(b64=t64 == dense["b64"], b32=t32 == dense["b32"])
        print(method, row, flush=True)


if __name__ == "__main__":
    main()
