// FP8 codes, decoded as cpemu/formats.py's _build_tables does, and reference._specials over them,
// shared by every cpemu kernel.
//
// is_e5m2 = 0: e4m3 (ml_dtypes float8_e4m3fn: bias 7, 3 fraction bits, NaN = S.1111.111, no
// infinity); is_e5m2 = 1: e5m2 (bias 15, 2 fraction bits, IEEE-like Inf and NaN).
#pragma once

__device__ __forceinline__ int cpemu_fp8_frac_bits(int is_e5m2) { return is_e5m2 ? 2 : 3; }

// One code: value = sign * m * 2**(e - frac_bits); sign is +1/-1 (bit 7, for every code); m
// the integer significand with the hidden bit (0 for zero, NaN and Inf); e the unbiased
// exponent (1 - bias for subnormals).
__device__ __forceinline__ void cpemu_fp8_decode(unsigned int code, int is_e5m2, int* sign, int* m, int* e,
                                                 int* nan, int* inf) {
    const int fb = is_e5m2 ? 2 : 3;
    const int eb = is_e5m2 ? 5 : 4;
    const int bias = is_e5m2 ? 15 : 7;
    const int efield = (int)((code >> fb) & ((1u << eb) - 1u));
    const int frac = (int)(code & ((1u << fb) - 1u));
    const int emax_field = (1 << eb) - 1;
    *sign = (code & 0x80u) ? -1 : 1;
    *m = efield == 0 ? frac : (frac | (1 << fb));
    *e = efield == 0 ? 1 - bias : efield - bias;
    if (is_e5m2) {
        *nan = efield == emax_field && frac != 0;
        *inf = efield == emax_field && frac == 0;
    } else {
        *nan = efield == emax_field && frac == (1 << fb) - 1;
        *inf = 0;
    }
    if (*nan || *inf) *m = 0;
}

// reference._specials for one output over K elements [k0, k1) of its rows of codes and the
// accumulator c: *nan (any NaN, inf * 0, or infinities of both signs), else *neg / *pos (an
// infinity of that sign decides the result); all 0: no NaN/Inf term, the step's value stands.
__device__ __forceinline__ void cpemu_fp8_specials(float c, const unsigned char* arow, const unsigned char* brow, int k0,
                                                   int k1, int a_e5m2, int b_e5m2, int* nan_out, int* pos_out,
                                                   int* neg_out) {
    int nan = 0, pos = 0, neg = 0;
    for (int k = k0; k < k1; ++k) {
        int as, am, ae, an, ai, bs, bm, be, bn, bi;
        cpemu_fp8_decode(arow[k], a_e5m2, &as, &am, &ae, &an, &ai);
        cpemu_fp8_decode(brow[k], b_e5m2, &bs, &bm, &be, &bn, &bi);
        const int a_zero = am == 0 && !an && !ai;
        const int b_zero = bm == 0 && !bn && !bi;
        nan |= an | bn | (ai & b_zero) | (a_zero & bi);
        const int inf_p = ai | bi;
        pos |= inf_p && as * bs > 0;
        neg |= inf_p && as * bs < 0;
    }
    const unsigned int cb = __float_as_uint(c);
    pos |= cb == 0x7F800000u;
    neg |= cb == 0xFF800000u;
    nan |= ((cb & 0x7FFFFFFFu) > 0x7F800000u) | (pos & neg);
    *nan_out = nan;
    *pos_out = pos;
    *neg_out = neg;
}
