"""Where the GPU waits in a profiled generation: busy and idle GPU time per iteration, and the idle time by the host
range active when the GPU went idle (``benchmarks/gpu/dustin_draft_profile.py --trace`` writes such a trace).

    python3 benchmarks/gpu/trace_idle.py DIR/trace.json.gz [--skip 5] [--iterations 20]

Iterations are counted from the ``phase:draft`` ranges on the host; GPU intervals (kernels, copies, memsets) are merged;
each gap between them is charged to the innermost host range (``record_function``) open at the gap's midpoint —
the host work the GPU was waiting for — or ``(between ranges)``. Gaps under 5 µs (between kernels of one graph) are
summed apart. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json


def idle_report(trace: dict, skip: int = 5, iterations: int = 20) -> dict:
    ev = trace["traceEvents"]
    gpu = sorted(((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                  and "dur" in e))
    host = sorted((e for e in ev if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    starts = [e["ts"] for e in host if e["name"] == "phase:draft"]
    if len(starts) < skip + 2:
        raise SystemExit(f"the trace has {len(starts)} iterations; need more than {skip + 1}")
    n = min(iterations, len(starts) - skip - 1)
    t0, t1 = starts[skip], starts[skip + n]
    busy, gaps, cur = 0.0, [], [t0, t0]  # an empty interval at the window's start: a leading gap is a gap too
    for s, f in gpu:
        if f <= t0 or s >= t1:
            continue
        s, f = max(s, t0), min(f, t1)
        if s > cur[1]:
            busy += cur[1] - cur[0]
            gaps.append((cur[1], s))
            cur = [s, f]
        else:
            cur[1] = max(cur[1], f)
    busy += cur[1] - cur[0]
    if cur[1] < t1:
        gaps.append((cur[1], t1))
    by_range: collections.Counter = collections.Counter()
    small = [b - a for a, b in gaps if b - a < 5]
    for a, b in gaps:
        if b - a < 5:
            continue
        mid = (a + b) / 2
        open_ = [e["name"] for e in host if e["ts"] <= mid < e["ts"] + e["dur"]]
        by_range[" > ".join(open_) or "(between ranges)"] += b - a
    return dict(iterations=n, us_per_iteration=dict(span=(t1 - t0) / n, gpu_busy=busy / n, gpu_idle=(t1 - t0 - busy) / n),
                idle_us_per_iteration_by_host_range={k: v / n for k, v in by_range.most_common()},
                gaps_under_5us=dict(count_per_iteration=len(small) / n, us_per_iteration=sum(small) / n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20)
    a = ap.parse_args(argv)
    opener = gzip.open if a.trace.endswith(".gz") else open
    with opener(a.trace, "rt") as f:
        print(json.dumps(idle_report(json.load(f), a.skip, a.iterations), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
