"""Peak memory and time of one reference GEMM (the numpy specification), for the memory bound.

Runs ``cpemu.reference.gemm_codes`` on random finite E4M3 codes with one unsplit chain over
K (fast accumulation), the schedule the Ada and Blackwell profiles assume, and prints one JSON
line: the shape, the instruction, the seconds, the peak resident set of the process (ru_maxrss),
the bytes of the inputs and the output, and the peak beyond them and the interpreter's own
footprint before the call. It calls the reference directly, so shapes outside a profile's
domain can be measured too.

    python tools/bench_memory.py --M 16 --N 16 --K 16777216 --instruction ada-sm89-mma-fp8
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--M", type=int, default=16)
    p.add_argument("--N", type=int, default=16)
    p.add_argument("--K", type=int, default=1 << 20)
    p.add_argument("--instruction", default="ada-sm89-mma-fp8")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    from cpemu import reference as ref
    from cpemu.formats import E4M3
    from cpemu.instruction import INSTRUCTIONS
    from cpemu.schedule import Plan

    rng = np.random.default_rng(0)
    a = rng.integers(0, 0x7E, (args.M, args.K), dtype=np.uint8)
    bt = rng.integers(0, 0x7E, (args.N, args.K), dtype=np.uint8)
    before = _rss_bytes()
    t0 = time.perf_counter()
    y = ref.gemm_codes(a, bt, E4M3, E4M3, Plan(((0, args.K),), None), INSTRUCTIONS[args.instruction],
                       {"order": "acc*(sa*sb)"}, np.float32(1), np.float32(1), None, "float32",
                       threads=args.threads)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rec = {"M": args.M, "N": args.N, "K": args.K, "instruction": args.instruction, "seconds": round(seconds, 2),
           "peak_rss_bytes": peak, "inputs_bytes": a.nbytes + bt.nbytes, "output_bytes": y.nbytes,
           "rss_before_call_bytes": before, "peak_beyond_start_bytes": max(0, peak - before)}
    print(json.dumps(rec))
    return rec


if __name__ == "__main__":
    main()
