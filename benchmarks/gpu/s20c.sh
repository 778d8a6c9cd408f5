# Session 2026-12-04b, second machine, next call: Dustin and Vegas iteration traces on the GFDL + MPL + Apache text.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
for m in dustin vegas; do
  timeout 45 python3 benchmarks/gpu/dustin_draft_profile.py --method $m --out $OUT/p$m --document .heldout/licenses_gfdl_mpl2_apache.txt \
    --new 48 --trace > $OUT/p$m.log 2>&1
  python3 benchmarks/gpu/trace_idle.py $OUT/p$m/trace.json.gz > $OUT/p$m/idle.txt 2>&1; head -30 $OUT/p$m/idle.txt
done
cd $OUT && tar czf prof.tgz *.log pdustin/profile.* pdustin/idle.txt pvegas/profile.* pvegas/idle.txt && rm -rf *.log pdustin pvegas
