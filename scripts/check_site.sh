#!/usr/bin/env bash
# Headless-browser check of the docs site: build it, serve it UNDER A SUB-PATH on 127.0.0.1 (as a
# project site would be), open the main pages in Debian's chromium with every other host unreachable,
# take a screenshot of each and fail on
#   * a request to any host but the local server (the site must work offline),
#   * a request the local server answers with 404 (a missing asset or page),
#   * a JavaScript error or console error on the page.
# Look at the screenshots before closing a docs change: broken layout is not something a script sees.
#
#   apt-get install -y chromium            # once (Debian package; no download by the script)
#   bash scripts/check_site.sh             # screenshots in site-check/*.png, exit 1 on a problem
#   SITE_CHECK_OUT=/tmp/shots SITE_CHECK_NO_BUILD=1 bash scripts/check_site.sh   # reuse ./site
#
# Takes ~1-2 min on 2 busy cores (the build is most of it); not part of scripts/test.sh, which
# already fails on broken links, anchors and external loads at build time (docs/hooks/sitecheck.py).
set -euo pipefail
cd "$(dirname "$0")/.."
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$CHROMIUM" ]; then
    echo "check_site: no chromium found; install Debian's: apt-get install -y chromium" >&2
    exit 2
fi
OUT=${SITE_CHECK_OUT:-site-check}
export OMP_NUM_THREADS=1 MPLBACKEND=Agg NO_MKDOCS_2_WARNING=1
if [ -z "${SITE_CHECK_NO_BUILD:-}" ]; then
    .venv/bin/mkdocs build --strict -d site   # no -q: it would hide the warnings --strict counts
fi
mkdir -p "$OUT"
exec .venv/bin/python - "$CHROMIUM" "$OUT" <<'PYEOF'
import functools, http.server, json, os, re, shutil, subprocess, sys, tempfile, threading
from pathlib import Path

chromium, out = sys.argv[1], Path(sys.argv[2])
SUB = "specdec"  # served at http://127.0.0.1:PORT/specdec/ — relative links must survive a sub-path
PAGES = {  # screenshot name -> page (relative to the site root)
    "home": "",
    "concept": "concepts/speculative-decoding/",
    "selector": "selectors/verification_guided/",
    "api": "api/engine/",
    "cli": "cli/",
    "benchmarks": "benchmarks/",
    "tutorial": "tutorials/01_pipeline/",
    "tutorial-vegas": "tutorials/vegas/",
    "tutorial-dustin": "tutorials/dustin/",
    "benchmark-runs": "benchmark-runs/",
    "writing-docs": "writing-docs/",
    "components-models": "components/models/",
    "not-found": "404.html",
}

root = Path(tempfile.mkdtemp(prefix="site-check-"))
(root / SUB).symlink_to(Path("site").resolve())
missing: list[str] = []


class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def send_error(self, code, message=None, explain=None):
        if code == 404:
            missing.append(self.path)
        super().send_error(code, message, explain)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
threading.Thread(target=server.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{server.server_address[1]}/{SUB}/"

problems = []
for name, rel in PAGES.items():
    profile = tempfile.mkdtemp(prefix="chromium-")
    netlog = Path(profile) / "net.json"
    before = len(missing)
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1400,1800",
           "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
           f"--log-net-log={netlog}", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=5000", f"--screenshot={(out / f'{name}.png').resolve()}", base + rel]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log = run.stderr
    # requests the PAGE made (initiator = the local server; chromium's own background requests have none)
    origin = base.split(f"/{SUB}/")[0]
    data = json.loads(netlog.read_text(errors="replace")) if netlog.exists() else {"events": [], "constants": {"logEventTypes": {}}}
    start_job = data["constants"]["logEventTypes"].get("URL_REQUEST_START_JOB")
    urls = {e["params"]["url"] for e in data["events"]
            if e.get("type") == start_job and e.get("params", {}).get("initiator") == origin}
    external = sorted(u for u in urls if not u.startswith(origin + "/"))
    console = [l for l in log.splitlines() if "CONSOLE" in l and re.search(r"Uncaught|Error|error|Failed", l)]
    for u in external:
        problems.append(f"{name}: requests {u} (outside the site)")
    for p in missing[before:]:
        problems.append(f"{name}: the server has no {p}")
    for l in console:
        problems.append(f"{name}: console: {l.split('] ', 1)[-1][:200]}")
    if run.returncode != 0 or not (out / f"{name}.png").is_file():
        problems.append(f"{name}: chromium exited {run.returncode} without a screenshot: {log[-300:]}")
    print(f"{'ok' if not problems or not problems[-1].startswith(name) else 'PROBLEM':7s} {name:18s} {base + rel}"
          f"  ({len(urls)} requests)")
    shutil.rmtree(profile, ignore_errors=True)
server.shutdown()
shutil.rmtree(root, ignore_errors=True)
for p in problems:
    print("  " + p, file=sys.stderr)
print(f"check_site: {len(PAGES)} pages, {len(problems)} problem(s); screenshots in {out}/")
sys.exit(1 if problems else 0)
PYEOF
