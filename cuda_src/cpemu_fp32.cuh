// FP32 arithmetic with explicit rounding (the schedule, the epilogue, the tiled kernel's
// truncations), FP32 values as integers and back (the integer T-FDPA step's), and the output
// conversions, shared by every cpemu kernel (the CUDA form of cpemu/reference.py's epilogue,
// _split_fp32 and _round_sum, and of cpemu/formats.py's encode_output).
//
// Every FP32 operation is a PTX instruction without .ftz: IEEE results with subnormals
// kept, whatever the compiler's -ftz / --fmad flags (cupy's NVRTC wrapper appends
// -ftz=true; the intrinsics __fmul_rn / __fadd_rn would then flush).
#pragma once

// Output kinds (kernels.py OUT_KIND).
#define CPEMU_OUT_F32 0
#define CPEMU_OUT_BF16 1
#define CPEMU_OUT_F16 2

// Epilogue orders (kernels.py EPILOGUE_ORDERS).
#define CPEMU_EP_ACC_SASB 0   // acc * (sa * sb)
#define CPEMU_EP_ACC_SA_SB 1  // (acc * sa) * sb
#define CPEMU_EP_ACC_SB_SA 2  // (acc * sb) * sa

// One FP32 PTX instruction each, its rounding in its name (rn: to nearest even, rz: toward
// zero); fma: a * b + c computed exactly and rounded once.
#define CPEMU_PTX_F32_2(name, insn)                                                  \
    __device__ __forceinline__ float name(float a, float b) {                        \
        float r;                                                                     \
        asm(insn " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                         \
        return r;                                                                    \
    }
#define CPEMU_PTX_F32_3(name, insn)                                                  \
    __device__ __forceinline__ float name(float a, float b, float c) {               \
        float r;                                                                     \
        asm(insn " %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));             \
        return r;                                                                    \
    }
CPEMU_PTX_F32_2(cpemu_fmul_rn, "mul.rn.f32")
CPEMU_PTX_F32_2(cpemu_fadd_rn, "add.rn.f32")
CPEMU_PTX_F32_2(cpemu_fsub_rn, "sub.rn.f32")
CPEMU_PTX_F32_2(cpemu_fadd_rz, "add.rz.f32")
CPEMU_PTX_F32_2(cpemu_fmul_rz, "mul.rz.f32")
CPEMU_PTX_F32_3(cpemu_fma_rn, "fma.rn.f32")
CPEMU_PTX_F32_3(cpemu_fma_rz, "fma.rz.f32")

// reference._split_fp32: FP32 c -> (sign, 24-bit integer significand, exponent) with
// c = sign * m * 2**(e - 23); subnormals keep e = -126; zero takes e_zero. NaN/Inf are taken
// as zero here (their result is decided by cpemu_fp8_specials).
__device__ __forceinline__ void cpemu_split_fp32(float c, int e_zero, int* sign, long long* m, int* e) {
    const unsigned int bits = __float_as_uint(c);
    const unsigned int efield = (bits >> 23) & 0xFFu;
    unsigned int frac = bits & 0x7FFFFFu;
    int ex;
    if (efield == 0xFFu) {  // np.where(np.isfinite(c64), c64, 0.0)
        frac = 0;
        ex = -126;
    } else if (efield == 0) {  // subnormal (or zero): e = -126, no hidden bit
        ex = -126;
    } else {
        frac |= 0x800000u;
        ex = (int)efield - 127;
    }
    *m = (long long)frac;
    *e = frac == 0 ? e_zero : ex;
    *sign = (frac != 0 && (bits >> 31)) ? -1 : 1;
}

// reference._round_sum: the exact sum S * 2**scale_exp rounded toward zero to frac_bits
// fraction bits, with exponents floored at -126, built exactly as an FP32 value (overflow to
// inf, as float64 -> float32 does); -0 -> +0.
__device__ __forceinline__ float cpemu_round_sum(long long S, int scale_exp, int frac_bits) {
    if (S == 0) return 0.0f;
    unsigned long long mag = (unsigned long long)(S < 0 ? -S : S);
    const int bl = 64 - __clzll((long long)mag);  // bit length of |S|
    const int e_res = max(scale_exp + bl - 1, -126);
    const int drop = min(max(e_res - frac_bits - scale_exp, 0), 62);
    mag = (mag >> drop) << drop;
    if (mag == 0) return 0.0f;
    const int bl2 = 64 - __clzll((long long)mag);
    const int e = scale_exp + bl2 - 1;  // exponent of the leading bit
    unsigned int bits;
    if (e > 127) {
        bits = 0x7F800000u;
    } else if (e >= -126) {  // normal: 24-bit significand with the hidden bit at bit 23
        const unsigned long long sig = bl2 > 24 ? (mag >> (bl2 - 24)) : (mag << (24 - bl2));
        bits = ((unsigned int)(e + 127) << 23) | ((unsigned int)sig & 0x7FFFFFu);
    } else {  // subnormal: units of 2**-149
        const int sh = scale_exp + 149;
        bits = (unsigned int)(sh >= 0 ? (mag << sh) : (-sh >= 64 ? 0ull : (mag >> -sh)));
    }
    if (S < 0) bits |= 0x80000000u;
    return __uint_as_float(bits);
}

// reference.epilogue for one output: scales in the profile's order (FP32 RN products),
// then + bias with one FP32 RN add.
__device__ __forceinline__ float cpemu_epilogue(float acc, float sa, float sb, int has_bias, float bias, int order) {
    float y;
    if (order == CPEMU_EP_ACC_SA_SB) {
        y = cpemu_fmul_rn(cpemu_fmul_rn(acc, sa), sb);
    } else if (order == CPEMU_EP_ACC_SB_SA) {
        y = cpemu_fmul_rn(cpemu_fmul_rn(acc, sb), sa);
    } else {
        y = cpemu_fmul_rn(acc, cpemu_fmul_rn(sa, sb));
    }
    if (has_bias) y = cpemu_fadd_rn(y, bias);
    return y;
}

// formats.encode_output for one value: FP32 -> bf16 bits, round to nearest even, overflow
// to inf, subnormals kept (ml_dtypes' cast); NaN -> nan_bits.
__device__ __forceinline__ unsigned int cpemu_encode_bf16(float y, unsigned int nan_bits) {
    const unsigned int u = __float_as_uint(y);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return nan_bits;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // RNE on the low 16 bits; carries reach inf
}

// FP32 -> fp16 bits, round to nearest even (numpy's cast), overflow to inf, subnormals kept.
__device__ __forceinline__ unsigned int cpemu_encode_f16(float y, unsigned int nan_bits) {
    const unsigned int u = __float_as_uint(y);
    const unsigned int sign = (u >> 16) & 0x8000u;
    const unsigned int a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return nan_bits;
    if (a >= 0x477FF000u) return sign | 0x7C00u;  // |y| >= 65520 (and inf): inf
    if (a >= 0x38800000u) {                       // |y| >= 2**-14: normal half
        const unsigned int r = a - 0x38000000u;   // rebias the exponent (127 -> 15)
        return sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13);
    }
    if (a <= 0x33000000u) return sign;  // |y| <= 2**-25: rounds to zero (2**-25 is a tie to even 0)
    // subnormal half: units of 2**-24; |y| = m * 2**(e - 150), 102 <= e <= 112
    const unsigned int e = a >> 23;
    const unsigned int m = (a & 0x7FFFFFu) | 0x800000u;
    const unsigned int s = 126u - e;  // 14..24
    unsigned int h = m >> s;
    const unsigned int rem = m & ((1u << s) - 1u);
    const unsigned int half = 1u << (s - 1u);
    if (rem > half || (rem == half && (h & 1u))) h += 1u;
    return sign | h;
}
