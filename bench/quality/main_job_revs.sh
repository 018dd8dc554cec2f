#!/usr/bin/env bash
# The README main job (bench.quality.main_job --no-setup --rev REV) at several commits, one after another in one
# invocation (run it through ../shared/tools/quiet); a spec is REV or REV:VAR=VALUE (an environment variable for
# that run). Each run writes OUT/SPEC/ (metrics.jsonl, meta.json); its training seconds go to OUT/steps_s.txt.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/quality/results/main_job/bisect_20261206}
for spec in "$@"; do
  mkdir -p "$OUT"; rev=${spec%%:*}; envs=""; [ "$spec" != "$rev" ] && envs=${spec#*:}
  name=$(echo "$spec" | tr ':=^' '__p')
  echo "== $spec -> $OUT/$name" >&2
  env $envs python -m bench.quality.main_job --no-setup --rev "$rev" --out "$OUT/$name" 2>&1 | tail -2
  python -c "
import json,sys
rows=[json.loads(l) for l in open('$OUT/$name/metrics.jsonl') if l.strip()]
s=[r for r in rows if r.get('event')=='input_summary']
print('$spec', 'steps_s', s[-1]['steps_s'] if s else None, 'psnr', json.load(open('$OUT/$name/metrics.json'))['psnr'])" | tee -a "$OUT/steps_s.txt"
done
