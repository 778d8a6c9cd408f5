# Session 2026-12-04d, third machine, first call (carries .whl and .model/a): the GPU tests of the graphs with
# `SpeculativeEngine.warm_up` (every step kind captured before calls that count), then the same test against a
# planted defect (a warm-up that skips the dense steps and the rungs after them: it must fail).
set -x
mkdir -p /tmp/m /tmp/site && cp .model/a/part_aa /tmp/m/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_greedy_chain.py 2>&1 | tail -3
cp specdec/adaptive.py /tmp/adaptive.py.bak
sed -i 's/        script += \[g, g\] + (\[0, g\] if dense else \[\])/        script += [g, g]/' specdec/adaptive.py
grep -n "script += " specdec/adaptive.py
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py -k warm_up 2>&1 | tail -4
cp /tmp/adaptive.py.bak specdec/adaptive.py
