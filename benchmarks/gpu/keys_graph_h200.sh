# Dustin's `layer_scores=keys` after three changes of 2026-12-06 (afternoon): the key basis and the prompt's projection
# at the prefill (prompt work, outside the decode loop), the plan replayed as a CUDA graph (the newly verified keys
# projected eagerly over a span the host knows), and the ranking's products on bfloat16 tensor cores (3 bfloat16 pieces
# of the float32 rows) with a radix select. Three calls, as the usual model upload:
#   STAGE=1 (carry .whl .model/a): wheels, model part a; select_top's sweep; ranking kernel sweeps at rank 32 and 16
#                                  + one layer's ranking and selection vs torch
#   STAGE=2 (carry .model/b):      model part b; the verify step's and the valve re-run's breakdowns (random weights,
#                                  B 64 x 8k)
#   STAGE=3 (carry .model/c .heldout): `specdec bench` at 8k x B 64 (8 / 4 windows per document), dense interleaved
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
case "${STAGE:-3}" in
1)
  mkdir -p /tmp/m /tmp/site && cp .model/a/part_aa /tmp/m/
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 100 python3 benchmarks/gpu/select_sweep.py > $OUT/select_sweep.txt 2>&1; echo select rc=$?
  cat $OUT/select_sweep.txt
  for r in 32 16; do
    timeout 150 python3 benchmarks/gpu/keyrank_sweep.py --rank $r --chunks 1024 --blocks 64,128 --warps 4 \
      --precisions tf32x3,bf16x3,bf16x2 > $OUT/keyrank_sweep_r$r.txt 2>&1; echo sweep r$r rc=$?
    tail -n 8 $OUT/keyrank_sweep_r$r.txt
    timeout 100 python3 benchmarks/gpu/keyrank_time.py --batch 64 --rank $r --out $OUT/keyrank_time_r$r.json \
      > $OUT/keyrank_time_r$r.txt 2>&1; echo time r$r rc=$?
    tail -c 1500 $OUT/keyrank_time_r$r.txt
  done
  ;;
2)
  cp .model/b/part_ab /tmp/m/
  timeout 400 python3 benchmarks/gpu/layer_plan_speed.py --out $OUT --reps 10 --settings \
    '{"25% layer_share 1.0 pages": {"layer_share": 1.0}, "25% keys r32": {"layer_share": 1.0, "layer_scores": "keys", "key_rank": 32}, "25% keys r16": {"layer_share": 1.0, "layer_scores": "keys", "key_rank": 16}}' \
    > $OUT/layer_plan_speed.txt 2>&1; echo lps rc=$?
  tail -n 80 $OUT/layer_plan_speed.md
  timeout 150 python3 benchmarks/gpu/valve_rerun_speed.py --out $OUT > $OUT/valve_rerun_speed.txt 2>&1; echo valve rc=$?
  head -n 16 $OUT/valve_rerun_speed.md
  ;;
3)
  ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
  md5sum /tmp/m/smol.gguf
  nvidia-smi --query-gpu=name --format=csv,noheader
  KEYS=dustin:layer_share=1.0:layer_scores=keys
  # windows: as many as each document holds (8,000 tokens each, 1,000 apart): click 8, GPL-3 + LGPL-2.1 4
  for spec in click_core.py:8 licenses_gpl3_lgpl21.txt:4; do
    doc=${spec%%:*}; win=${spec##*:}; tag=${TAG:-gpu_dustin_keys_graph}_${doc%%.*}
    timeout ${LIMIT:-270} python3 -m specdec bench \
      --methods dense,$KEYS:key_rank=32:margin=0.1,$KEYS:key_rank=16:margin=0.1,$KEYS:key_rank=16,dustin \
      --budget-ratio 0.25 --contexts 8000 --batch-sizes 64 --windows $win --documents .heldout/$doc \
      --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT --tag $tag \
      > $OUT/$tag.log 2>&1
    echo bench $doc rc=$?
    grep -v "━" $OUT/$tag.log | grep "|" | cut -c1-260
    tail -n 2 $OUT/$tag.log
  done
  ;;
esac
