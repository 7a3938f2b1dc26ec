// cpemu: pass 2 of a T-FDPA step of the tiled kernels (the truncated sum: cuda-tiled's sign-corrected
// integers, cuda-rzacc's biased accumulator, or the int64 path for F > 16) and the output
// conversion; included by cpemu_tiled.cuh (see its file comment).
#pragma once

// The magnitudes and sign masks of n consecutive rows r0.. of tile t at K element kk (vector
// loads of 4 rows, or of 2 when n is not a multiple of 4).
template <int n, int R>
__device__ __forceinline__ void cpt_load_vs(const CptTile<R>& t, int kk, int r0, float (&v)[n], cpt_u32 (&s)[n]) {
    static_assert(n % 2 == 0, "vector loads of 2 or 4 rows");
    if (n % 4 == 0) {
#pragma unroll
        for (int i = 0; i < n; i += 4) {
            const float4 x = *(const float4*)&t.v[kk][r0 + i];
            const uint4 m = *(const uint4*)&t.s[kk][r0 + i];
            v[i] = x.x, v[i + 1] = x.y, v[i + 2] = x.z, v[i + 3] = x.w;
            s[i] = m.x, s[i + 1] = m.y, s[i + 2] = m.z, s[i + 3] = m.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < n; i += 2) {
            const float2 x = *(const float2*)&t.v[kk][r0 + i];
            const uint2 m = *(const uint2*)&t.s[kk][r0 + i];
            v[i] = x.x, v[i + 1] = x.y;
            s[i] = m.x, s[i + 1] = m.y;
        }
    }
}

#if CPT_RZACC
// Pass 2 by the biased accumulator (F <= 14; kernels.py checks): for each output, X = B + c
// truncated, B = 1.5 * 2**(g + 23) with g = e_max - F: X's binade [2**(g+23), 2**(g+24)) has
// the ulp 2**g, and every partial sum stays in it (|c| < 2**(e_max+1), each |product| <
// 2**(e_max+2), L <= 32 products: |X - B| < 2**(e_max+8) <= 2**(g+22) for F <= 14). Each product
// is then one fma.rz(a, b, X) of the signed values, which adds exactly floor(a*b / 2**g) * 2**g.
// floor differs from the reference's truncation toward zero by one unit for a negative product
// with bits below 2**g, i.e. lambda_a + lambda_b < g (lambda: the exponent of an operand's lowest
// set bit; the product of two odd significands is odd). Those are counted four at a time from
// bytes na = 63 - (lambda_a - lambda_min_a) and nb likewise (0 for zero codes):
//     x = na + nb + T, T = clamp(g - 1 - lambda_min_a - lambda_min_b, -1, 62) + 2,
// whose bit 7 is set exactly for a nonzero pair with lambda_a + lambda_b <= g - 1 (x stays in
// [1, 190]: no carry between bytes; a zero code gives x <= 127), ANDed with the XOR of the sign
// bits and summed by dp4a (128 per counted product). The count is added to X's bit pattern (one
// ulp each), X - B is exact (Sterbenz), and clearing the low 23 - R bits rounds it toward zero to
// R fraction bits. cpemu/rzacc_twin.py is this arithmetic in numpy, with these claims asserted.

// The pieces of cpt_sum_rzacc (below) around its loop: the biased accumulators, the threshold bytes and
// the counts of the thread's outputs before the step's products (cpt_rzacc_begin), and the step's
// results (cpt_rzacc_end). CPT_PIPE2 runs them around a loop of its own (cpt_rzacc_group).
#if CPT_LEAN
// CPT_LEAN's form of the two (a measurement build; the same bits): em holds the FP32 bits of 2**e_max
// (cpt_emax_bf16_bits). With Blo = 1.5 * 2**e_max (its exponent field, a mantissa of one half) and
// sc = 2**(23 - F), B = Blo * sc exactly. c is truncated in the frame of its own sign: T = RZ(Cs * sc
// + c) with Cs = Blo of c's sign lies in B's binade (|c| < 2**(g + F + 1) <= 2**(g + 22)), so it is
// sign(c) * (B + floor(|c| / 2**g) * 2**g), and T - Cs * sc = trunc(c) and B + trunc(c) are exact.
// begin leaves Blo in em for end, whose X - B is one exact FMA; its rounding to R fraction bits waits
// for the chain's end (the kernel body).
__device__ __forceinline__ float cpt_lean_scale(int F) { return __uint_as_float((cpt_u32)(150 - F) << 23); }

// (a & b) | c in one LOP3 (ptxas splits it into two where b and c are both immediates)
__device__ __forceinline__ cpt_u32 cpt_and_or(cpt_u32 a, cpt_u32 b, cpt_u32 c) {
    cpt_u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ void cpt_rzacc_begin(const float (&acc)[CPT_TM][CPT_TN], int (&em)[CPT_TM][CPT_TN],
                                                int F, int lmin, float (&X)[CPT_TM][CPT_TN],
                                                cpt_u32 (&T4)[CPT_TM][CPT_TN], cpt_u32 (&cnt)[CPT_TM][CPT_TN]) {
    const float sc = cpt_lean_scale(F);
    // F >> 8 is 0: the OR keeps both masks in registers, so that cpt_and_or is one LOP3
    const cpt_u32 emask = 0x7F800000u | (cpt_u32)(F >> 8), half = 0x400000u | (cpt_u32)(F >> 8);
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            const cpt_u32 Mb = (cpt_u32)em[i][j];
            const cpt_u32 Bb = cpt_and_or(Mb, emask, half);  // Blo = 1.5 * 2**e_max
            const float Cs = __uint_as_float(Bb | (__float_as_uint(acc[i][j]) & 0x80000000u));
            const float ct = cpemu_fma_rn(Cs, -sc, cpemu_fma_rz(Cs, sc, acc[i][j]));  // trunc(c), exact
            X[i][j] = cpemu_fma_rn(__uint_as_float(Bb), sc, ct);                      // B + trunc(c), exact
            T4[i][j] = (cpt_u32)(min(max((int)(Mb >> 23) - 127 - F - 1 - lmin, -1), 62) + 2) * 0x01010101u;
            cnt[i][j] = 0u;
            em[i][j] = (int)Bb;
        }
}

__device__ __forceinline__ void cpt_rzacc_end(const float (&X)[CPT_TM][CPT_TN], const cpt_u32 (&cnt)[CPT_TM][CPT_TN],
                                              const int (&em)[CPT_TM][CPT_TN], int F, cpt_u32 rmask,
                                              float (&out)[CPT_TM][CPT_TN]) {
    const float sc = cpt_lean_scale(F);
    (void)rmask;
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            const float Xc = __uint_as_float(__float_as_uint(X[i][j]) + (cnt[i][j] >> 7));
            out[i][j] = cpemu_fma_rn(__uint_as_float((cpt_u32)em[i][j]), -sc, Xc);  // rounded at the chain's end
        }
}
#else
__device__ __forceinline__ void cpt_rzacc_begin(const float (&acc)[CPT_TM][CPT_TN], const int (&em)[CPT_TM][CPT_TN],
                                                int F, int lmin, float (&X)[CPT_TM][CPT_TN],
                                                cpt_u32 (&T4)[CPT_TM][CPT_TN], cpt_u32 (&cnt)[CPT_TM][CPT_TN]) {
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            const int g = em[i][j] - F;  // em >= -126 (the exponent of c counts), so g + 23 >= -116
            const cpt_u32 Cb = (cpt_u32)(g + 150) << 23;  // 2**(g + 23)
            // c truncated toward zero to the grid 2**g: RZ(c + Cs) - Cs, Cs = +-2**(g+23) of c's sign
            const float Cs = __uint_as_float(Cb | (__float_as_uint(acc[i][j]) & 0x80000000u));
            const float ct = cpemu_fsub_rn(cpemu_fadd_rz(acc[i][j], Cs), Cs);
#if CPT_KPARTS > 1
            X[i][j] = cpemu_fadd_rn(__uint_as_float(Cb | 0x400000u), CPT_PART == 0 ? ct : 0.0f);  // c in part 0 only
#else
            X[i][j] = cpemu_fadd_rn(__uint_as_float(Cb | 0x400000u), ct);  // exact: both on the grid, in the binade
#endif
            T4[i][j] = (cpt_u32)(min(max(g - 1 - lmin, -1), 62) + 2) * 0x01010101u;
            cnt[i][j] = 0u;
        }
}

__device__ __forceinline__ void cpt_rzacc_end(const float (&X)[CPT_TM][CPT_TN], const cpt_u32 (&cnt)[CPT_TM][CPT_TN],
                                              const int (&em)[CPT_TM][CPT_TN], int F, cpt_u32 rmask,
                                              float (&out)[CPT_TM][CPT_TN]) {
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            const cpt_u32 Bb = ((cpt_u32)(em[i][j] - F + 150) << 23) | 0x400000u;
            const float Xc = __uint_as_float(__float_as_uint(X[i][j]) + (cnt[i][j] >> 7));
#if CPT_KPARTS > 1
            float D = cpemu_fsub_rn(Xc, __uint_as_float(Bb));  // exact: this part's sum in units of 2**g
#pragma unroll
            for (int d = 1; d < CPT_KPARTS; d <<= 1) D = cpemu_fadd_rn(D, __shfl_xor_sync(0xFFFFFFFFu, D, d));  // exact
            out[i][j] = __uint_as_float(__float_as_uint(D) & rmask);
#else
            out[i][j] = __uint_as_float(__float_as_uint(cpemu_fsub_rn(Xc, __uint_as_float(Bb))) & rmask);
#endif
        }
}
#endif  // CPT_LEAN

// The products of the 4 K elements K4 .. K4 + 3 of the stage's chunk for the thread's outputs: 4 FMA.RZ
// per output into X, and the count of products to move up by one unit into cnt (T4 holds T in every
// byte). One text for cpt_sum_rzacc's loop and CPT_PIPE2's cpt_rzacc_group: a macro, not a call, so the
// shipped build's code (and its register allocation) is what the loop spelled out gives. Needs sh, ty,
// tx, X, T4 and cnt in scope. CPT_PROBE_SKIP & 2 leaves the count out, & 4 leaves out its sign LOP3.
#if CPT_PROBE_SKIP & 2
#define CPT_RZACC_COUNT(i, j)
#elif CPT_PROBE_SKIP & 4  // the count's inner cost with signs folded into the bytes (docs/design-notes.md)
#define CPT_RZACC_COUNT(i, j) \
    cnt[i][j] = (cpt_u32)__dp4a((int)(la[i] + lb[j] + T4[i][j]), 0x01010101, (int)cnt[i][j]);
#else
#define CPT_RZACC_COUNT(i, j) \
    cnt[i][j] = __dp4a((la[i] + lb[j] + T4[i][j]) & (sa[i] ^ sb[j]), 0x01010101u, cnt[i][j]);
#endif
#define CPT_RZACC_GROUP(K4)                                                                                  \
    {                                                                                                         \
        float va[4][CPT_TM], vb[4][CPT_TN];                                                                   \
        cpt_u32 la[CPT_TM], lb[CPT_TN], sa[CPT_TM], sb[CPT_TN];                                               \
        _Pragma("unroll") for (int h = 0; h < 4; ++h) {                                                       \
            cpt_load_words(reinterpret_cast<const cpt_u32*>(&sh.a.v[(K4) + h][ty * CPT_TM]),                 \
                           reinterpret_cast<cpt_u32(&)[CPT_TM]>(va[h]));                                      \
            cpt_load_words(reinterpret_cast<const cpt_u32*>(&sh.b.v[(K4) + h][tx * CPT_TN]),                 \
                           reinterpret_cast<cpt_u32(&)[CPT_TN]>(vb[h]));                                      \
        }                                                                                                     \
        cpt_load_words(&sh.a.lam[(K4) / 4][ty * CPT_TM], la);                                                 \
        cpt_load_words(&sh.b.lam[(K4) / 4][tx * CPT_TN], lb);                                                 \
        cpt_load_words(&sh.a.sg[(K4) / 4][ty * CPT_TM], sa);                                                  \
        cpt_load_words(&sh.b.sg[(K4) / 4][tx * CPT_TN], sb);                                                  \
        _Pragma("unroll") for (int i = 0; i < CPT_TM; ++i)                                                    \
        _Pragma("unroll") for (int j = 0; j < CPT_TN; ++j) {                                                  \
            _Pragma("unroll") for (int h = 0; h < 4; ++h) X[i][j] = cpemu_fma_rz(va[h][i], vb[h][j], X[i][j]); \
            CPT_RZACC_COUNT(i, j)                                                                             \
        }                                                                                                     \
    }

#if CPT_PIPE2
__device__ __forceinline__ void cpt_rzacc_group(const CptStage& sh, int ty, int tx, int k4, float (&X)[CPT_TM][CPT_TN],
                                                const cpt_u32 (&T4)[CPT_TM][CPT_TN],
                                                cpt_u32 (&cnt)[CPT_TM][CPT_TN]) {
    CPT_RZACC_GROUP(k4)
}
#endif

template <int KL>  // KL > 0: klen == KL, known at compile time (CPT_FIXED_L)
__device__ __forceinline__ void cpt_sum_rzacc(const CptStage& sh, int ty, int tx, int kofs, int klen_,
                                              const float (&acc)[CPT_TM][CPT_TN], const int (&em)[CPT_TM][CPT_TN],
                                              int F, int lmin, cpt_u32 rmask, float (&out)[CPT_TM][CPT_TN]) {
    const int klen = KL > 0 ? KL : klen_;
    float X[CPT_TM][CPT_TN];     // the biased accumulator
    cpt_u32 T4[CPT_TM][CPT_TN];  // T in every byte
    cpt_u32 cnt[CPT_TM][CPT_TN]; // 128 * the products to move up by one unit
#if CPT_LEAN
    int Bb[CPT_TM][CPT_TN];  // e_max's bits, then Blo's (cpt_rzacc_begin)
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) Bb[i][j] = em[i][j];
#else
    const int (&Bb)[CPT_TM][CPT_TN] = em;
#endif
    cpt_rzacc_begin(acc, Bb, F, lmin, X, T4, cnt);
    CPT_STEP_LOOP(kk, klen, 4, CPT_UNROLL(KL > 0 ? KL / 4 : CPT_SUM_UNROLL))  // words of 4 codes; klen is a multiple of 8
        CPT_RZACC_GROUP(kofs + kk)
    cpt_rzacc_end(X, cnt, Bb, F, rmask, out);
}
#else
// Pass 2, fast path (F <= 16): out[i][j] = the step's result before NaN/Inf handling (see
// the file comment: T = RZ(|a| * |b| + C), y = bits(T) ^ sign mask, summed as integers).
__device__ __forceinline__ void cpt_sum_fast(const CptStage& sh, int ty, int tx, int klen,
                                             const float (&acc)[CPT_TM][CPT_TN], const int (&em)[CPT_TM][CPT_TN],
                                             int F, cpt_u32 rmask, float (&out)[CPT_TM][CPT_TN]) {
    cpt_u32 Cb[CPT_TM][CPT_TN];  // bits of C = 2**(e_max - F + 23), the truncation constant of each output
    cpt_u32 Y[CPT_TM][CPT_TN];   // the products' sum, in units of 2**(e_max - F), wrapping
    float ct[CPT_TM][CPT_TN];    // c truncated to the grid 2**(e_max - F)
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            // C = 2**(e_max - F + 23). A nonzero product has E >= -28 and a nonzero c is a
            // multiple of a previous step's grid (>= 2**-41), so e_max - F + 23 >= -103 whenever a
            // term can be nonzero; the clamp (exponent field >= 24) only acts when every term
            // is zero, and keeps C and 2**g below normal numbers
            Cb[i][j] = (cpt_u32)max(em[i][j] + 150 - F, 24) << 23;
            // c truncated toward zero to the grid 2**g (|c| < 2**(e_max + 1) <= 2**(g + 23)):
            // RZ(c + Cs) with Cs = +-C of c's sign, minus Cs (exact, Sterbenz)
            const float Cs = __uint_as_float(Cb[i][j] | (__float_as_uint(acc[i][j]) & 0x80000000u));
            ct[i][j] = cpemu_fsub_rn(cpemu_fadd_rz(acc[i][j], Cs), Cs);
            Y[i][j] = 0u - Cb[i][j] * (cpt_u32)klen;
        }
CPT_UNROLL(CPT_SUM_UNROLL)
    for (int kk = 0; kk < klen; kk += 2) {  // klen is a multiple of 8
        float va[2][CPT_TM], vb[2][CPT_TN];
        cpt_u32 sa[2][CPT_TM], sb[2][CPT_TN];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            cpt_load_vs(sh.a, kk + h, ty * CPT_TM, va[h], sa[h]);
            cpt_load_vs(sh.b, kk + h, tx * CPT_TN, vb[h], sb[h]);
        }
#pragma unroll
        for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
            for (int j = 0; j < CPT_TN; ++j) {
                const float C = __uint_as_float(Cb[i][j]);
                const cpt_u32 y0 = __float_as_uint(cpemu_fma_rz(va[0][i], vb[0][j], C)) ^ sa[0][i] ^ sb[0][j];
                const cpt_u32 y1 = __float_as_uint(cpemu_fma_rz(va[1][i], vb[1][j], C)) ^ sa[1][i] ^ sb[1][j];
                Y[i][j] += y0 + y1;
            }
    }
    cpt_u32 na[CPT_TM], nb[CPT_TN];
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i) na[i] = sh.a.neg[ty * CPT_TM + i];
#pragma unroll
    for (int j = 0; j < CPT_TN; ++j) nb[j] = sh.b.neg[tx * CPT_TN + j];
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            // + bits(C) * n_neg * 2 + n_neg: the negative products' terms (codes past klen are +0)
            const cpt_u32 nneg = (cpt_u32)__popc(na[i] ^ nb[j]);
            const int S = (int)(Y[i][j] + nneg * (2u * Cb[i][j] + 1u));
            const float p2 = __uint_as_float(Cb[i][j] - (23u << 23));  // 2**g
            // |S| < 2**21 converts exactly; S * 2**g + c truncated is a multiple of 2**g below
            // 2**(g + 22) in magnitude, so the RN fused multiply-add is exact
            // (never -0: x - x and S * 2**g + 0 are +0 in RN, and a nonzero result is a multiple
            // of 2**g >= 2**(-126 - F), which the rounding below keeps nonzero)
            out[i][j] = __uint_as_float(__float_as_uint(cpemu_fma_rn(__int2float_rn(S), p2, ct[i][j])) & rmask);
        }
}

// Pass 2, integer path (any F): reference.tfdpa's int64 arithmetic.
__device__ __forceinline__ void cpt_sum_int(const CptStage& sh, int ty, int tx, int klen,
                                            const float (&acc)[CPT_TM][CPT_TN], const int (&em)[CPT_TM][CPT_TN],
                                            int F, int R, int e_zero, float (&out)[CPT_TM][CPT_TN]) {
    cpt_i64 S[CPT_TM][CPT_TN];
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            int cs, ce;
            cpt_i64 cm;
            cpemu_split_fp32(acc[i][j], e_zero, &cs, &cm, &ce);
            const int rc = em[i][j] - ce + (23 - F);
            S[i][j] = (cpt_i64)cs * (rc >= 0 ? (cm >> min(rc, 62)) : (cm << min(-rc, 62)));
        }
#pragma unroll 1
    for (int kk = 0; kk < klen; ++kk) {
        cpt_u32 ma[CPT_TM], mb[CPT_TN], sa[CPT_TM], sb[CPT_TN];
        int ea[CPT_TM], eb[CPT_TN];
#pragma unroll
        for (int i = 0; i < CPT_TM; ++i) {
            ma[i] = __float_as_uint(sh.a.v[kk][ty * CPT_TM + i]);
            sa[i] = sh.a.s[kk][ty * CPT_TM + i];
            ea[i] = sh.a.e[kk][ty * CPT_TM + i];
        }
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) {
            mb[j] = __float_as_uint(sh.b.v[kk][tx * CPT_TN + j]);
            sb[j] = sh.b.s[kk][tx * CPT_TN + j];
            eb[j] = sh.b.e[kk][tx * CPT_TN + j];
        }
#pragma unroll
        for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
            for (int j = 0; j < CPT_TN; ++j) {
                const cpt_u32 P = ma[i] * mb[j];                        // (m_a << S0) * m_b < 2**28
                const int shift = min(em[i][j] - (ea[i] + eb[j]), 31);  // e_max - E
                const cpt_i64 T = (cpt_i64)(P >> shift);
                S[i][j] += (sa[i] ^ sb[j]) ? -T : T;
            }
    }
#pragma unroll
    for (int i = 0; i < CPT_TM; ++i)
#pragma unroll
        for (int j = 0; j < CPT_TN; ++j) out[i][j] = cpemu_round_sum(S[i][j], em[i][j] - F, R);
}

#endif  // CPT_RZACC

// formats.encode_output for one value (cpemu_fp32.cuh's conversions).
__device__ __forceinline__ cpt_u32 cpt_encode(float y, int out_kind, cpt_u32 nan_bits) {
    const cpt_u32 u = __float_as_uint(y);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return nan_bits;
    if (out_kind == CPEMU_OUT_F32) return u;
    if (out_kind == CPEMU_OUT_BF16) return cpemu_encode_bf16(y, nan_bits);
    return cpemu_encode_f16(y, nan_bits);
}
