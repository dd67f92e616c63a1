#!/usr/bin/env bash
# On the head: bring one worker's copy of the snapshot to the head's over the fabric, sending
# only what the worker lacks, then verify it there; the copy engine (copy_engine.py weights)
# does it, and its docstring has the flags. Kept as the step's command, so the graph names the
# same script.
exec python3 "$(dirname "$0")/copy_engine.py" weights "$@"
