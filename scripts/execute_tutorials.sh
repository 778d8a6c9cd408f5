#!/usr/bin/env bash
# Execute tutorials top to bottom (small settings, one thread) and STORE the outputs in the notebooks:
# the site shows the stored outputs, and the docs build refuses a tutorial without them.
#   bash scripts/execute_tutorials.sh                              # every tutorials/*.ipynb
#   bash scripts/execute_tutorials.sh tutorials/dustin.ipynb       # only this one
# Same as `bash scripts/run_tutorials.sh --write ...`; nothing is written for a notebook that fails
# (an exception, a timeout, or output on stderr).
exec bash "$(dirname "$0")/run_tutorials.sh" --write "$@"
