#!/bin/bash
# Finished sequences read nothing vs their whole context (benchmarks/gpu/finished14.py) on two held-out documents.
# Needs /tmp/m/part_aa, part_ab (earlier calls), .model/c/part_ac and .heldout carried, wheels in /tmp/site.
set -u
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf || exit 1
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
for doc in click_core.py licenses_gfdl_mpl2_apache.txt; do
  echo "== $doc"
  timeout 240 python3 benchmarks/gpu/finished14.py --model /tmp/m/smol.gguf --document .heldout/$doc \
    --out $OUT/finished14_${doc%%.*}.json 2>&1 | grep -v -i warn || echo "exit $?"
done
