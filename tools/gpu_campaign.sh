#!/usr/bin/env bash
# Record everything cpemu learns from a GPU in one go: truth suites, torch's argument
# checks, and cuBLASLt's heuristic choices (query + torch's own calls, logged).
#   tools/gpu_campaign.sh OUTDIR [step ...]     steps: truth truth2 errors heur splitk tiles complete beyond rowbias
#   beyond:   the heuristic on shapes above the recorded domain (splitk_measure --sets beyond, a few seconds of
#             16 cores): the evidence for a profile's domain.no_split (tests/data/h200-splitk/measured/README.md)
#   rowbias:  rowwise scales with fast accumulation, with and without bias, on 64 split-region pairs at every K of
#             the complete grid (splitk_measure --sets rowbias, about 3.6 million answers, a minute or two of 16
#             cores): where cuBLASLt has an algorithm with bias (tests/data/h200-splitk/measured/README.md)
#   tiles:    the planned round of tests/data/h200-splitk/tiles (the newest cases<n>.json without native<n>.npz)
#   complete: continues the complete split-K record for RECORD_SECONDS (default 540) with one worker per core
#             (RECORD_JOBS), skipping the pairs of RECORD_TABLE (default the shipped table; empty: none); runs
#             beside the steps after it (tests/data/h200-splitk/complete/README.md says how to merge). A range
#             beside the default plan: RECORD_ARGS="--n-min 65552 --n-max 131072" RECORD_TABLE= (its first run);
#             the rowwise bias record: RECORD_ARGS="--options rowwise-bias --n-min 8192" RECORD_TABLE=
#             RECORD_DIR: the record's folder (default a fresh one under the work folder); a folder that
#             stays between commands (e.g. build/rec on a host that keeps ignored paths) is continued, not redone
#   parity:   live parity (tools/live_parity.py) beside the record, one process per seed of PARITY_SEEDS (default
#             "1"), each for PARITY_SECONDS (default RECORD_SECONDS or 540); records parity-<seed>.json
#   AS_H200=1: run every step through tools/as_h200.sh (an H100 reporting the H200's device attributes, so that
#             cuBLASLt's heuristic answers as the H200's: tests/data/h100-splitk/as-h200/README.md)
# Writes OUTDIR/campaign.tar.gz (all results) and OUTDIR/campaign.log.
set -u
OUTDIR=${1:?usage: gpu_campaign.sh OUTDIR [steps]}
shift
STEPS=${*:-truth errors heur}
PY=${PYTHON:-python3}
if [ "${AS_H200:-0}" = 1 ]; then PY="$(dirname "$0")/as_h200.sh $PY"; fi
W=$(mktemp -d)
LOG="$OUTDIR/campaign.log"
mkdir -p "$OUTDIR" "$W/res"
export PYTHONUNBUFFERED=1
step() { echo "=== $* ($(date +%T))" | tee -a "$LOG"; "$@" >>"$LOG" 2>&1; echo "=== rc=$? ($(date +%T))" | tee -a "$LOG"; }
nvidia-smi >>"$LOG" 2>&1
REC_PID=
PAR_PIDS=
for s in $STEPS; do
  case $s in
    complete)
      echo "=== complete record for ${RECORD_SECONDS:-540} s ($(date +%T))" | tee -a "$LOG"
      TABLE=${RECORD_TABLE-cpemu/profile_data/hopper-h200-torch.splitk-complete.npz}
      # shellcheck disable=SC2086  # RECORD_ARGS: options of their own, e.g. "--n-min 65552 --n-max 131072"
      REC_DIR=${RECORD_DIR:-$W/res/rec}
      $PY -m cpemu.recording.splitk_enum run --dir "$REC_DIR" --jobs "${RECORD_JOBS:-$(nproc)}" \
        --seconds "${RECORD_SECONDS:-540}" ${TABLE:+--table "$TABLE"} ${RECORD_ARGS:-} \
        >>"$W/res/enum.log" 2>&1 &
      REC_PID=$! ;;
    parity)
      for sd in ${PARITY_SEEDS:-1}; do
        S=${PARITY_SECONDS:-${RECORD_SECONDS:-540}}
        $PY tools/live_parity.py --calls 2000 --seed "$sd" --max-seconds "$S" --out "$W/res/parity-$sd.json" \
          >>"$W/res/parity-$sd.log" 2>&1 &
        PAR_PIDS="$PAR_PIDS $!"
      done ;;
    tiles)
      T=tests/data/h200-splitk/tiles
      n=$(ls $T | sed -n 's/^cases\([0-9][0-9]*\)\.json$/\1/p' | sort -n | tail -1)
      if [ -n "$n" ] && [ ! -e "$T/native$n.npz" ]; then
        step $PY tools/splitk_tiles.py native --cases "$T/cases$n.json" --out "$W/res/native$n.npz"
      else
        echo "=== tiles: no planned round" | tee -a "$LOG"
      fi ;;
    truth)
      step $PY tools/record_truth.py record --out "$W/res/truth" ;;
    beyond)
      step $PY -m cpemu.recording.splitk_measure --sets beyond --jobs "$(nproc)" --out "$W/res/measured" ;;
    rowbias)
      step $PY -m cpemu.recording.splitk_measure --sets rowbias --jobs "$(nproc)" --out "$W/res/measured"
      $PY -m cpemu.recording.no_algorithm_report "$W/res/measured/rowbias.npz" > "$W/res/measured/rowbias_report.json" \
        2>>"$LOG" ;;
    errors)
      step $PY tools/record_truth.py probe-errors --out "$W/res/errors.json" ;;
    truth2)
      step $PY tools/record_truth.py record --suite splitk2 --out "$W/res/truth" ;;
    splitk)
      S="$PY tools/splitk_table.py record"
      step $S --evo2 --combos evo2 --out "$W/res/splitk_evo2.json"
      step $S --random 20000 --seed 1 --combos main --out "$W/res/splitk_heldout_main.json"
      step $S --random 20000 --seed 2 --region split --combos main --out "$W/res/splitk_heldout_region.json"
      step $S --random 3000 --seed 3 --combos all --out "$W/res/splitk_heldout_all.json"
      step $S --grid wide --grid dense-splitk --combos all --out "$W/res/splitk_grid.json" ;;
    heur)
      $PY - > "$W/truth_shapes.json" <<'PYEOF'
import json
from cpemu.cases import SUITES, suite
print(json.dumps(sorted({(c.M, c.N, c.K) for s in SUITES for c in suite(s)})))
PYEOF
      H="$PY tools/cublaslt_heuristic.py"
      step $H selftest
      step $H torch-log --grid smoke --scale-mode tensorwise --scale-mode rowwise --bias both --out "$W/res/torchlog_smoke.json"
      step $H query --grid wide --out "$W/res/heur_wide.json"
      step $H query --grid dense-splitk --out "$W/res/heur_dense.json"
      step $H query --shapes-file "$W/truth_shapes.json" --out-dtype bfloat16 --out-dtype float16 --out-dtype float32 --bias both --scale-mode tensorwise --scale-mode rowwise --in-dtypes e4m3,e4m3 --in-dtypes e4m3,e5m2 --in-dtypes e5m2,e4m3 --out "$W/res/heur_truth.json"
      step $H torch-log --shapes-file "$W/truth_shapes.json" --out-dtype bfloat16 --out-dtype float32 --bias both --scale-mode tensorwise --scale-mode rowwise --out "$W/res/torchlog_truth.json"
      step $H torch-log --grid dense-splitk --every 7 --out "$W/res/torchlog_dense.json" ;;
  esac
done
if [ -n "$REC_PID" ]; then wait "$REC_PID"; echo "=== complete record rc=$? ($(date +%T))" | tee -a "$LOG"; fi
for p in $PAR_PIDS; do wait "$p"; echo "=== live parity rc=$? ($(date +%T))" | tee -a "$LOG"; done
# a record folder kept outside the work folder travels in the archive too, as rec/
if [ -n "${RECORD_DIR:-}" ] && [ -d "$RECORD_DIR" ]; then rm -rf "$W/res/rec"; cp -r "$RECORD_DIR" "$W/res/rec"; fi
tar -C "$W/res" -czf "$OUTDIR/campaign.tar.gz" .
ls -la "$OUTDIR" | tee -a "$LOG"
