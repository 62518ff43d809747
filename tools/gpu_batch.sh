#!/usr/bin/env bash
# One GPU batch: set up (tools/gpu_session.sh), then run each "name:seconds:command" step with its own time limit,
# its whole output in $OUT/<name>.log and its last lines on stdout. A step that fails or times out does not stop
# the rest. Do not pipe a step into `tail`: its log keeps only what tail printed, and nothing when the limit
# kills the step (its whole log is in $OUT already).
#   bash tools/gpu_batch.sh "tests:300:python3 -m pytest -q -m gpu tests" "rows:120:python3 benchmarks/rows.py --quick"
source "$(dirname "$0")/gpu_session.sh" || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for step in "$@"; do
  name=${step%%:*}; rest=${step#*:}; limit=${rest%%:*}; cmd=${rest#*:}
  start=$SECONDS
  timeout "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - start)) s"
  tail -n "${TAIL_LINES:-15}" "$OUT/$name.log"
done
