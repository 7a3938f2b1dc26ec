// The T-FDPA steps of reference.accumulate's schedule, one at a time, shared by the cpemu
// kernels that keep the steps of many outputs in step (gemm_simple.cu's staged kernel,
// cpemu_tiled.cuh).
//
// The plan (cpemu/schedule.py) cuts K into n_slices slices [k0, k1) (split-K; slices[2 s],
// slices[2 s + 1]); each slice is one chain (fast accumulation) or chains of promotion * L
// elements (promotion > 0), and each chain steps L elements at a time, the last step of a
// chain possibly shorter. Slices are never empty.
#pragma once

// One step: slice s = [k0, k1); its chain [cstart, cend), clen elements long (the last
// chain of the slice possibly shorter); the step [k, ke), ke = min(k + L, cend).
struct CpemuStep {
    int s, k0, k1, clen, cstart, cend, k, ke;
};

// p = the first step of slice s.
__device__ __forceinline__ void cpemu_step_slice(CpemuStep& p, const int* __restrict__ slices, int s, int promotion,
                                                 int L) {
    p.s = s;
    p.k0 = slices[2 * s];
    p.k1 = slices[2 * s + 1];
    p.clen = promotion > 0 ? promotion * L : p.k1 - p.k0;
    p.cstart = p.k0;
    p.cend = min(p.k0 + p.clen, p.k1);
    p.k = p.k0;
    p.ke = min(p.k0 + L, p.cend);
}

// Moves p to the next step: returns 0 in the same chain, 1 the next chain of the slice,
// 2 the next slice, 3 none left (p unchanged).
__device__ __forceinline__ int cpemu_step_next(CpemuStep& p, const int* __restrict__ slices, int n_slices,
                                               int promotion, int L) {
    if (p.ke < p.cend) {
        p.k = p.ke;
        p.ke = min(p.k + L, p.cend);
        return 0;
    }
    if (p.cend < p.k1) {
        p.cstart = p.cend;
        p.cend = min(p.cstart + p.clen, p.k1);
        p.k = p.cstart;
        p.ke = min(p.k + L, p.cend);
        return 1;
    }
    if (p.s + 1 < n_slices) {
        cpemu_step_slice(p, slices, p.s + 1, promotion, L);
        return 2;
    }
    return 3;
}
