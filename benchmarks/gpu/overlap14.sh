#!/bin/bash
# Two half-batches on two streams vs one batch (benchmarks/gpu/overlap14.py) on two held-out documents.
# Needs /tmp/m/part_aa, part_ab (earlier calls), .model/c/part_ac and .heldout carried, wheels in /tmp/site.
set -u
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf || exit 1
md5sum /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
for doc in click_core.py licenses_gfdl_mpl2_apache.txt; do
  echo "== $doc"
  timeout 200 python3 benchmarks/gpu/overlap14.py --model /tmp/m/smol.gguf --document .heldout/$doc \
    --repeats 3 --out $OUT/overlap14_${doc%%.*}.json 2>&1 | grep -v -i warning || echo "exit $?"
done
