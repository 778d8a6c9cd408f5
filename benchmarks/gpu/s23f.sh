# Session 2026-12-04e, fourth machine, third call (after .whl + .model/a and .model/b): does running the HF baselines
# (default and static-cache generate, the latter torch.compile'd) change specdec's later rows? Dense and MagicDec on one
# 8k prose window at B 64 before and after them: torch's global switches, τ, tokens (benchmarks/gpu/hf_state.py).
set -x
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/gpu/hf_state.py --model /tmp/m/smol.gguf --document .heldout/licenses_gfdl_mpl2_apache.txt \
  --out $OUT 2>&1 | grep -v Warning | tail -12
