"""Run ``python -m specdec ARGS`` with Python's stack dumped if it is still running after ``FH_AFTER`` seconds.

For runs under torchrun, whose SIGTERM at a time limit kills the ranks without a Python stack::

    FH_AFTER=240 torchrun --nproc-per-node 2 benchmarks/gpu/fh_run.py bench ... --tp 2

Every rank then writes each thread's stack to stderr at ``FH_AFTER`` seconds and exits (``faulthandler``).
"""

import faulthandler
import os
import runpy
import sys

faulthandler.dump_traceback_later(float(os.environ.get("FH_AFTER", "600")), exit=True)
sys.argv = ["specdec", *sys.argv[1:]]
runpy.run_module("specdec", run_name="__main__", alter_sys=True)
