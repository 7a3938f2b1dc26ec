"""One call of a CUDA backend, twice, for a profiler to catch (the first call is the one profiled).

    python one_call.py FAMILY MxNxK [DATA] [NAME=VALUE ...]     (from the repository root)

FAMILY: cuda-simple or cuda-tiled; DATA: a data kind of cpemu.cases (default gauss40); the
NAME=VALUE macros compile the kernel from source with them. hopper-h200-torch profile, e4m3
operands, tensorwise unit scales, bf16 output, fast accumulation.
"""
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, ".")
from cpemu.cases import Case, operands  # noqa: E402
from cpemu.cuda import kernels  # noqa: E402
from cpemu.profile import get_profile  # noqa: E402

fam = sys.argv[1]
M, N, K = (int(x) for x in sys.argv[2].split("x"))
data = sys.argv[3] if len(sys.argv) > 3 else "gauss40"
defs = tuple(sys.argv[4:])
prof = get_profile("hopper-h200-torch")
a, bt, *_ = operands(Case(M, N, K, data=data, seed=1))
ad, btd = cp.asarray(a), cp.asarray(bt)
plan = prof.plan(M, N, K, True)
for _ in range(2):
    y = kernels.gemm_cuda(fam, ad, btd, "e4m3", "e4m3", plan, prof.instruction, prof.mode("tensorwise"),
                          np.float32(1), np.float32(1), None, "bfloat16", defines=defs)
cp.cuda.Device().synchronize()
print("ok", fam, M, N, K, data, defs)
