// cpemu: pass 1 of a T-FDPA step of the tiled kernels (e_max over the step's products and c), the
// NaN/Inf classes and the shared-memory word loads; included by cpemu_tiled.cuh, which defines the
// geometry, the stage layout and the kernel body (see its file comment).
#pragma once

// ------------------------------------------------------------------------ one step

// Exponent of the accumulator c for e_max: reference._split_fp32's for normal and subnormal
// (-126) c. Zero c gets -126 instead of e_zero: this changes e_max only when every product
// is zero too, and then the step's result is +0 either way. A non-finite c (its output is
// decided by cpt_specials) gets 128.
__device__ __forceinline__ int cpt_c_exp(float c) {
    return (int)max((__float_as_uint(c) >> 23) & 0xFFu, 1u) - 127;
}

// reference._specials (cpemu_fp8_specials) out of line: the step calls it only for the outputs
// whose codes or accumulator hold a NaN or Inf.
__device__ __noinline__ int cpt_specials(float c, const cpt_u8* __restrict__ arow, const cpt_u8* __restrict__ brow,
                                         int k0, int k1, int a_fmt, int b_fmt) {
    int nan, pos, neg;
    cpemu_fp8_specials(c, arow, brow, k0, k1, a_fmt, b_fmt, &nan, &pos, &neg);
    return nan ? 3 : neg ? 2 : pos ? 1 : 0;  // the class: 0 the step's value stands, 1 +inf, 2 -inf, 3 NaN
}

// n consecutive 32-bit words w[r0..] (vector loads of 4, or of 2 when n is not a multiple of 4).
template <int n>
__device__ __forceinline__ void cpt_load_words(const cpt_u32* w, cpt_u32 (&x)[n]) {
    static_assert(n % 2 == 0, "vector loads of 2 or 4 words");
    if (n % 4 == 0) {
#pragma unroll
        for (int i = 0; i < n; i += 4) {
            const uint4 v = *(const uint4*)&w[i];
            x[i] = v.x, x[i + 1] = v.y, x[i + 2] = v.z, x[i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < n; i += 2) {
            const uint2 v = *(const uint2*)&w[i];
            x[i] = v.x, x[i + 1] = v.y;
        }
    }
}

// a * b + c on two bf16 lanes, rounded to nearest (PTX fma.rn.bf16x2, sm_80 and newer)
__device__ __forceinline__ cpt_u32 cpt_bf16x2_fma(cpt_u32 a, cpt_u32 b, cpt_u32 c) {
    cpt_u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

#if CPT_KPARTS > 1
// e_max over the parts of one output: the max across its CPT_KPARTS lanes
__device__ __forceinline__ void cpt_parts_max(int (&em)[CPT_TM][CPT_TN]) {
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j)
#pragma unroll
            for (int d = 1; d < CPT_KPARTS; d <<= 1) em[i][j] = max(em[i][j], __shfl_xor_sync(0xFFFFFFFFu, em[i][j], d));
}
#endif

#if CPT_PASS1_MMA || CPT_EPROD
// bf16 mma.sync m16n8k16 with an FP32 accumulator (sm_80 and newer): the tensor-core form of pass 1
// (cpt_emax_mma below, cpemu_rzacc_eprod)
__device__ __forceinline__ void cpt_mma_bf16(float (&d)[4], const cpt_u32 (&a)[4], cpt_u32 b0, cpt_u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// E_max of a sum X of the terms above (cpt_emax_bf16's reading, on FP32 bits); -128 when every
// product is zero (below any exponent of c, which is at least -126)
__device__ __forceinline__ int cpt_emax_of(float x) {
    const cpt_u32 u = __float_as_uint(x);
    return u ? (int)(((u >> 23) + 1u) >> 3) - 14 : -128;
}

// The warp's 16 x 64 tile of E_max bytes of one step (K elements [kofs, kofs + klen) of a 32-element
// chunk) into emx, from the chunk's pass-1 operands xa (the block's A rows) and xb (its B rows): one
// m16n8k16 MMA per 8 columns and 16 K elements, rows 16 w .. 16 w + 15 for warp w.
__device__ __forceinline__ void cpt_emax_tile_mma(const cpt_u32 (&xa)[CPT_KT / 2][CPT_BM],
                                                  const cpt_u32 (&xb)[CPT_KT / 2][CPT_BN], int kofs, int klen,
                                                  signed char (&emx)[CPT_BM][CPT_BN]) {
    const int lane = (int)threadIdx.x & 31, g = lane >> 2, c = lane & 3, r0 = 16 * ((int)threadIdx.x >> 5);
    const int q0 = kofs / 2;  // the step's first pair of K elements in the chunk
    cpt_u32 a[2][4];          // A fragments of K elements [16 h, 16 h + 16) of the step, 0 past klen
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int q = q0 + 8 * h + c;
        const bool lo = 16 * h + 2 * c < klen, hi = 16 * h + 2 * c + 8 < klen;
        a[h][0] = lo ? xa[q][r0 + g] : 0u;
        a[h][1] = lo ? xa[q][r0 + g + 8] : 0u;
        a[h][2] = hi ? xa[q + 4][r0 + g] : 0u;
        a[h][3] = hi ? xa[q + 4][r0 + g + 8] : 0u;
    }
#pragma unroll
    for (int t = 0; t < CPT_BN / 8; ++t) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        cpt_mma_bf16(d, a[0], xb[q0 + c][8 * t + g], xb[q0 + c + 4][8 * t + g]);
        if (klen > 16) cpt_mma_bf16(d, a[1], xb[q0 + 8 + c][8 * t + g], xb[q0 + 12 + c][8 * t + g]);
        // d: (row g, columns 2c and 2c + 1) and (row g + 8, the same columns) of tile t
        const cpt_u32 top = ((cpt_u32)cpt_emax_of(d[0]) & 0xFFu) | (((cpt_u32)cpt_emax_of(d[1]) & 0xFFu) << 8);
        const cpt_u32 bot = ((cpt_u32)cpt_emax_of(d[2]) & 0xFFu) | (((cpt_u32)cpt_emax_of(d[3]) & 0xFFu) << 8);
        *(cpt_u16*)&emx[r0 + g][8 * t + 2 * c] = (cpt_u16)top;
        *(cpt_u16*)&emx[r0 + g + 8][8 * t + 2 * c] = (cpt_u16)bot;
    }
}
#endif

#if CPT_STAGE_PASS1  // the passes below read the stage's pass-1 operand
// Pass 1 for e4m3 x e4m3, on the FP pipe (the integer pipe is the busy one): e_max of the
// products is read off X = sum over the step's products of 2**(8 (E - 2)) = 2**(8 (e_a - 1)) *
// 2**(8 (e_b - 1)), summed in bf16 (two lanes: even and odd k). Every term is an exact power of
// two; with at most 16 positive terms per lane, each <= 2**(8 (E_max - 2)), and round-to-nearest
// additions (monotonic, relative error <= 2**-8 each), a lane's X lies in
// [2**(8 (E_max - 2)), 2**(8 (E_max - 2) + 4.1)), so floor(log2 X) / 8 rounded down is
// E_max - 2 exactly (8 > 4.1). e4m3 products have E in [-12, 16]: every X stays a normal bf16
// (2**-112 to 2**117). Zero, NaN and Inf codes contribute 0.
// The sums X of the thread's outputs, one pair of K elements: pair q of the stage's 32-element
// chunk (its codes 2q and 2q + 1).
__device__ __forceinline__ void cpt_emax_bf16_pair(const CptStage& sh, int ty, int tx, int q,
                                                   cpt_u32 (&X)[CPT_TM][CPT_TN]) {
    cpt_u32 xa[CPT_TM], xb[CPT_TN];
    cpt_load_words(&sh.a.x2[q][ty * CPT_TM], xa);
    cpt_load_words(&sh.b.x2[q][tx * CPT_TN], xb);
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) X[i][j] = cpt_bf16x2_fma(xa[i], xb[j], X[i][j]);
}

// e_max of one output from its sum X and its accumulator c.
__device__ __forceinline__ int cpt_emax_bf16_read(cpt_u32 X, float c) {
    // the larger lane (positive bf16 bits order like their values); 0: every product is zero
    const cpt_u32 mx = max(X & 0xFFFFu, X >> 16);
    // floor((be - 127) / 8) + 2 for the biased exponent be = mx >> 7 (>= 15)
    const int e = mx ? (int)(((mx >> 7) + 1u) >> 3) - 14 : CPT_SENT;
    return max(cpt_c_exp(c), e);
}

#if CPT_LEAN
// CPT_LEAN: e_max of one output as the FP32 bits of a power of two whose exponent is e_max (the
// reading of cpt_emax_bf16_read, without leaving the bit patterns). CPT_LEAN's A terms are doubled
// (cpt_build_luts), so a lane's X lies in [2**(8 (E_max - 2) + 1), 2**(8 (E_max - 2) + 5.1)) and its
// biased exponent be in [8 E_max + 112, 8 E_max + 116]: be >> 3 = E_max + 14. W's top half is the
// larger lane, so W >> 26 = be >> 3 >= 2 (E_max >= -12), and the products' 2**E_max has the exponent
// field (W >> 26) + 113. Without a select: y = (W - 2**27) >> 3 (arithmetic) is ((W >> 26) - 2) * 2**23
// plus bits below 2**23 for W >= 2**27, and -2**24 for W = 0 (every product zero); masking keeps the
// field and the sign, so p = (y & 0x9F800000) + 115 * 2**23 is that power of two, or a negative number
// when every product is zero. The larger of |c| and p (fmaxf: a NaN c leaves p; its output is decided
// by cpt_specials) has e_max in its exponent field, and is +0 only when c and every product are zero
// (then the step's result is +0 whatever the grid). cpemu.rzacc_twin.emax_bits is this in numpy.
__device__ __forceinline__ cpt_u32 cpt_emax_bf16_bits(cpt_u32 X, float c) {
    const cpt_u32 W = max(X, __byte_perm(X, 0u, 0x1032u));
    const cpt_u32 p = ((cpt_u32)((int)(W - 0x8000000u) >> 3) & 0x9F800000u) + (115u << 23);
    return __float_as_uint(fmaxf(fabsf(c), __uint_as_float(p)));
}
#endif

// KL > 0: klen == KL, known at compile time (the loop unrolled in full; CPT_FIXED_L)
template <int KL>
__device__ __forceinline__ void cpt_emax_bf16(const CptStage& sh, int ty, int tx, int kofs, int klen_,
                                              const float (&acc)[CPT_TM][CPT_TN], int (&em)[CPT_TM][CPT_TN]) {
    const int klen = KL > 0 ? KL : klen_;
    cpt_u32 X[CPT_TM][CPT_TN];
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) X[i][j] = 0u;
    CPT_STEP_LOOP(q, klen / 2, 1, CPT_UNROLL(KL > 0 ? KL / 2 : CPT_EMAX_UNROLL)) {
        cpt_emax_bf16_pair(sh, ty, tx, kofs / 2 + q, X);
    }
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j)
#if CPT_LEAN
            em[i][j] = (int)cpt_emax_bf16_bits(X[i][j], acc[i][j]);
#else
            em[i][j] = cpt_emax_bf16_read(X[i][j], acc[i][j]);
#endif
#if CPT_KPARTS > 1
    cpt_parts_max(em);
#endif
}

#if CPT_PASS1_MMA
// Pass 1 for e4m3 x e4m3 on tensor cores (measurement build, with CPT_PREDECODE): the same sum as
// cpt_emax_bf16, X = sum of 2**(8 (e_a - 1)) * 2**(8 (e_b - 1)) over the step's products, by
// bf16 mma.sync with an FP32 accumulator, one m16n8k16 tile per 16 rows, 8 columns and 16 K
// elements: a warp's outputs (2 x 8 rows of 8 x 4 per thread, all 64 columns) are one 16 x 64
// tile. The terms are exact powers of two (8 (E - 2) in [-112, 112]: normal FP32) and there are
// at most 32: whatever alignment and rounding the tensor core applies, as long as it keeps the
// largest term, X lies in [2**(8 (E_max - 2)), 2**(8 (E_max - 2) + 5.1)), so its exponent read as
// in cpt_emax_bf16 is E_max exactly. The 64 x 64 results go through shared memory (emx) to the
// threads that own the outputs. Only sm_80 and newer (mma.sync bf16).
static_assert(!CPT_PASS1_MMA || (CPT_PREDECODE && CPT_BM == 64 && CPT_BN == 64 && CPT_TM == 8 && CPT_TN == 4),
              "CPT_PASS1_MMA: gemm_rzacc_pre's geometry (a warp's outputs are one 16 x 64 tile)");

__device__ __forceinline__ void cpt_emax_mma(const CptStage& sh, signed char (&emx)[CPT_BM][CPT_BN], int ty, int tx,
                                             int kofs, int klen, const float (&acc)[CPT_TM][CPT_TN],
                                             int (&em)[CPT_TM][CPT_TN]) {
    cpt_emax_tile_mma(sh.a.x2, sh.b.x2, kofs, klen, emx);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i) {
        const cpt_u32 w = *(const cpt_u32*)&emx[ty * CPT_TM + i][tx * CPT_TN];
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) em[i][j] = max(cpt_c_exp(acc[i][j]), (int)(signed char)(w >> (8 * j)));
    }
    __syncwarp();  // emx is read before the next step writes it
}
#endif

// Pass 1: em[i][j] = max(e_max of the products, exponent of c) for the thread's outputs.
__device__ __forceinline__ void cpt_emax(const CptStage& sh, int ty, int tx, int kofs, int klen,
                                         const float (&acc)[CPT_TM][CPT_TN], int (&em)[CPT_TM][CPT_TN]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
    // Lanes: m0[p][q] = (out(2p, 2q), out(2p+1, 2q+1)), m1[p][q] = (out(2p, 2q+1), out(2p+1, 2q)).
    cpt_u32 m0[CPT_TM / 2][CPT_TN / 2], m1[CPT_TM / 2][CPT_TN / 2];
#pragma unroll
    for (int p = 0; p < CPT_TM / 2; ++p)
#pragma unroll
        for (int q = 0; q < CPT_TN / 2; ++q) {
            m0[p][q] = ((cpt_u32)cpt_c_exp(acc[2 * p][2 * q]) & 0xFFFFu) |
                       ((cpt_u32)cpt_c_exp(acc[2 * p + 1][2 * q + 1]) << 16);
            m1[p][q] = ((cpt_u32)cpt_c_exp(acc[2 * p][2 * q + 1]) & 0xFFFFu) |
                       ((cpt_u32)cpt_c_exp(acc[2 * p + 1][2 * q]) << 16);
        }
    CPT_STEP_LOOP(kk, klen, 1, CPT_UNROLL(1)) {
        cpt_u32 a2[CPT_TM / 2], b2[CPT_TN / 2], bs[CPT_TN / 2];
#pragma unroll
        for (int p = 0; p < CPT_TM / 2; ++p) a2[p] = *(const cpt_u32*)&sh.a.e[kofs + kk][ty * CPT_TM + 2 * p];
#pragma unroll
        for (int q = 0; q < CPT_TN / 2; ++q) {
            b2[q] = *(const cpt_u32*)&sh.b.e[kofs + kk][tx * CPT_TN + 2 * q];
            bs[q] = __byte_perm(b2[q], 0u, 0x1032);  // swap the halves
        }
#pragma unroll
        for (int p = 0; p < CPT_TM / 2; ++p)
#pragma unroll
            for (int q = 0; q < CPT_TN / 2; ++q) {
                m0[p][q] = __viaddmax_s16x2(a2[p], b2[q], m0[p][q]);
                m1[p][q] = __viaddmax_s16x2(a2[p], bs[q], m1[p][q]);
            }
    }
#pragma unroll
    for (int p = 0; p < CPT_TM / 2; ++p)
#pragma unroll
        for (int q = 0; q < CPT_TN / 2; ++q) {
            em[2 * p][2 * q] = (int)(short)(m0[p][q] & 0xFFFFu);
            em[2 * p + 1][2 * q + 1] = (int)m0[p][q] >> 16;
            em[2 * p][2 * q + 1] = (int)(short)(m1[p][q] & 0xFFFFu);
            em[2 * p + 1][2 * q] = (int)m1[p][q] >> 16;
        }
#if CPT_KPARTS > 1
    cpt_parts_max(em);
#endif
#else
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) em[i][j] = cpt_c_exp(acc[i][j]);
    CPT_STEP_LOOP(kk, klen, 1, CPT_UNROLL(1)) {
        int ea[CPT_TM], eb[CPT_TN];
#pragma unroll
        for (int i = 0; i < CPT_TM; ++i) ea[i] = sh.a.e[kofs + kk][ty * CPT_TM + i];
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) eb[j] = sh.b.e[kofs + kk][tx * CPT_TN + j];
#pragma unroll
        for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
            for (int j = 0; j < CPT_TN; ++j) em[i][j] = max(em[i][j], ea[i] + eb[j]);
    }
#if CPT_KPARTS > 1
    cpt_parts_max(em);
#endif
#endif
}
#endif  // CPT_STAGE_PASS1

#if CPT_LEAN
// cpt_emax's exponents (at least -126; 128 for a non-finite c) as CPT_LEAN's bits of 2**e_max
__device__ __forceinline__ void cpt_emax_to_bits(int (&em)[CPT_TM][CPT_TN]) {
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) em[i][j] = (int)((cpt_u32)min(em[i][j] + 127, 255) << 23);
}
#endif
