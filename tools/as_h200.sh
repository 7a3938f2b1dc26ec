#!/usr/bin/env bash
# Run a command on another Hopper GPU (an H100) with the H200's device attributes, so that cuBLASLt's
# heuristic answers as on the H200: tools/as_h200.sh python -m cpemu.recording.splitk_enum run ...
# The attributes are the H200's own, read by Nsight Compute on the H200 host
# (benchmarks/h200-rzacc-profile/ncu-rzacc-stalls-M2048.txt): clock 1,980,000 kHz, 132 SMs, memory clock
# 3,201,000 kHz, bus width 6,016 bits, L2 62,914,560 bytes (persisting 39,321,600), 150,109,880,320 bytes of
# memory, name "NVIDIA H200". An H100 reports 2,619,000 kHz, 5,120 bits, 52,428,800 bytes and 85,017,493,504.
# tests/data/h100-splitk/as-h200/README.md gives the evidence that the heuristic then answers as the H200's.
set -euo pipefail
SHIM=${SHIM:-/tmp/cpemu_device_attrs_shim.so}
# built beside, then moved into place: a second command started meanwhile never loads a half-written file
gcc -O2 -shared -fPIC -o "$SHIM.$$" "$(dirname "$0")/device_attrs_shim.c" -ldl && mv -f "$SHIM.$$" "$SHIM"
# CUdevice_attribute: 13 clock rate, 16 SM count, 36 memory clock, 37 bus width, 38 L2 size, 108 persisting L2
export SPOOF_ATTRS="13=1980000,16=132,36=3201000,37=6016,38=62914560,108=39321600"
export SPOOF_TOTAL_MEM=150109880320 SPOOF_NAME="NVIDIA H200"
LD_PRELOAD="$SHIM${LD_PRELOAD:+:$LD_PRELOAD}" exec "$@"
