// cpemu: the tiled exact FP8 GEMM kernel (the body and its design: cpemu_tiled.cuh).
//
// 64 x 64 outputs per block of 128 threads, 8 x 4 outputs per thread: the geometry for
// GEMMs with enough outputs to fill the GPU (kernels.py tiled_module_for picks the geometry).

#define CPT_BM 64
#define CPT_BN 64
#ifndef CPT_TM
#define CPT_TM 8  // outputs per thread along M
#endif
#ifndef CPT_TN
#define CPT_TN 4  // outputs per thread along N
#endif
#ifndef CPT_MINBLOCKS
#define CPT_MINBLOCKS 2
#endif
#define CPT_SMEM_BYTES 46080

#include "cpemu_tiled.cuh"

extern "C" __global__ void __launch_bounds__(CPT_THREADS, CPT_MINBLOCKS) cpemu_gemm_tiled(CPT_KERNEL_PARAMS) {
    cpt_gemm_tiled_body(CPT_KERNEL_ARGS);
}
