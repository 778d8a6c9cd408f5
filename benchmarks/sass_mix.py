"""Static cost of the split-K attention kernel's variants, without a GPU: compile for sm_90 and count.

    PYTHONPATH=. python benchmarks/sass_mix.py                                # 8B verify shape, both launches
    PYTHONPATH=/path/to/triton-3.6:. python benchmarks/sass_mix.py --launch 64,3,4 --variants plain,tile,direct

Compiles ``specdec.cuda.triton_attention._splitk_attn_kernel`` (dense verify, ``T`` rows, ``G`` query heads per KV
head, head dim ``D``, bf16) for an H200 (``GPUTarget("cuda", 90, 32)``) with Triton's own ``ptxas`` and
``cuobjdump`` (shipped in the triton wheel; no driver needed) and prints per variant and launch: registers,
shared memory (how many programs fit on an SM), barriers and instructions in the whole kernel, and the
instruction mix of the hot loop (the backward-branch region with the most ``HMMA``). Integer arguments are
declared divisible by 16, as Triton specialises them at a real launch (without it the loop is not pipelined).
Use the GPU's Triton version for numbers that match it (the H200 machine runs triton 3.6).

Variants: ``plain`` (no scores), ``tile`` (``sink_softmax`` scores, today's default), ``direct``
(``score_store="direct"``), ``lean`` (``score_store="lean"``), ``pre`` (``sink_anchors="pre"``), ``loop``
(``sink_anchors="loop"``), ``fast`` (``LaunchConfig.fast_loop``: ``fold``, the running max in log2 units, and
``split``, the dense tiles every row sees run unmasked before the masked rest) and ``+`` combinations
(``plain+fast``: no scores, the fast loop). With ``split`` the kernel has two tile loops: the hot loop is the first
of those with the most ``HMMA`` (the unmasked one), the other's count is the column "other loop". A static count is
a prediction aid, not a timing.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from specdec.cuda import triton_attention as ta  # noqa: E402

FLAGS = {"direct": "DIRECT_STORE", "pre": "ANCHOR_IN", "loop": "ANCHOR_LOOP", "fold": "LOG2_FOLD",
         "split": "SPLIT_TILES"}
#: the tile loop of ``LaunchConfig.fast_loop`` (the default since 2026-12-02): both switches
GROUPS = {"fast": ("LOG2_FOLD", "SPLIT_TILES")}
#: score_store "lean" (direct stores + the folded sink factor)
STORES = {"lean": ("DIRECT_STORE", "SINK_FOLD")}
POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "Lens": "*i64", "Idx": "*i64", "DenseFrom": "*i64"}
FP32_POINTERS = {"RowW", "RowSlot", "PartO", "PartLse", "Scores", "RawLogits", "OutLse", "Sem", "SinkRef"}
NO_DIV = {"NUM_SPLITS", "KPLAN", "NSLOT", "sm_scale", "stride_ib", "stride_ih"}


def compile_variant(variant: str, block_n: int, stages: int, warps: int, D: int, T: int, G: int, hkv: int):
    fn = ta._splitk_attn_kernel
    scores = variant.split("+")[0] != "plain"
    const = dict(HKV=hkv, T=T, G=G, D=D, BLOCK_M=max(16, triton.next_power_of_2(T * G)), BLOCK_N=block_n,
                 SPARSE=False, SCORE_MODE=4 if scores else 0, DOT_PREC="tf32", UPCAST=False, NOUT=1, DIRECT_OUT=False,
                 ZERO_TAIL=scores, V_EARLY=False, FUSED_COMBINE=False, FUSED_SOFTMAX=False, SCORE_EXP=scores,
                 SINK_CLAMP=60.0, NA=ta.SINK_ANCHORS, ANCHOR_IN=False, DIRECT_STORE=False, ANCHOR_LOOP=False,
                 SINK_FOLD=False, PDL=False, LOG2_FOLD=False, SPLIT_TILES=False)
    for part in variant.split("+"):
        if part in FLAGS:
            const[FLAGS[part]] = True
        elif part in STORES:
            const.update(dict.fromkeys(STORES[part], True))
        elif part in GROUPS:
            const.update(dict.fromkeys(GROUPS[part], True))
        elif part not in ("plain", "tile"):
            raise SystemExit(f"unknown variant part {part!r}; use plain, tile, direct, lean, pre, loop, fold, split, fast "
                             "(joined by +)")
    sig = {}
    for n in fn.arg_names:
        if n in const:
            sig[n] = "constexpr"
        elif n == "sm_scale":
            sig[n] = "fp32"
        elif n in POINTERS or n in FP32_POINTERS:
            sig[n] = POINTERS.get(n, "*fp32")
        else:
            sig[n] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] not in ("constexpr", "fp32") and n not in NO_DIV}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def inspect(kernel) -> dict:
    bind = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    sass = subprocess.run([os.path.join(bind, "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    usage = subprocess.run([os.path.join(bind, "cuobjdump"), "--dump-resource-usage", f.name],
                           capture_output=True, text=True).stdout
    os.unlink(f.name)
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = []
    for a, txt in ins:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", txt)
        if m and int(m.group(1), 16) < a:
            loops.append([t for b, t in ins if int(m.group(1), 16) <= b <= a])
    top = max((sum("HMMA" in t for t in body) for body in loops), default=0)
    hot = [body for body in loops if top and sum("HMMA" in t for t in body) == top]
    best = hot[0] if hot else None
    other = len(hot[1]) if len(hot) > 1 else 0
    mix = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in best or [])
    regs = re.search(r"REG:(\d+)", usage)
    smem = kernel.metadata.shared
    return dict(regs=int(regs.group(1)) if regs else -1, smem_kb=smem / 1024,
                per_sm=min(228 * 1024 // max(smem + 1024, 1), 65536 // max(1, (int(regs.group(1)) if regs else 1)
                                                                             * 32 * kernel.metadata.num_warps)),
                kernel=len(ins), barriers=sass.count("BAR.SYNC"), loop=len(best or []), other=other, mix=mix)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="plain,tile,direct,pre,pre+direct,loop+direct")
    ap.add_argument("--launch", nargs="+", default=["64,3,4", "128,3,4"], help="block_n,num_stages,num_warps")
    ap.add_argument("--shape", default="128,5,4,8", help="D,T,G,H_kv (default: Llama-3.1-8B verify, 5 rows)")
    a = ap.parse_args()
    D, T, G, hkv = map(int, a.shape.split(","))
    keys = ["HMMA", "BAR", "SHFL", "MUFU", "STS", "LDS", "STG"]
    print(f"triton {triton.__version__}, sm_90, D {D}, T {T}, G {G}, H_kv {hkv}\n")
    print("| launch | variant | regs | smem KB | programs/SM | kernel instr | kernel BAR | hot-loop instr | other loop | "
          + " | ".join(f"loop {k}" for k in keys) + " |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * len(keys))
    for launch in a.launch:
        bn, st, w = map(int, launch.split(","))
        for v in a.variants.split(","):
            r = inspect(compile_variant(v, bn, st, w, D, T, G, hkv))
            print(f"| bn{bn} s{st} w{w} | {v} | {r['regs']} | {r['smem_kb']:.0f} | {r['per_sm']} | {r['kernel']} | "
                  f"{r['barriers']} | {r['loop']} | {r['other']} | " + " | ".join(str(r["mix"].get(k, 0)) for k in keys) + " |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
