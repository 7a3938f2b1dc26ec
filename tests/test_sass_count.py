"""tools/sass_count.py's reading of nvdisasm text (no GPU, no nvdisasm: a written sample)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import sass_count as sc  # noqa: E402

SAMPLE = """
	.section	.text.k_outer,"ax",@progbits
k_outer:
.text.k_outer:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDS.128 R4, [R2] ;
.L_x_2:
        /*0020*/                   FFMA.RZ R8, R4, R5, R8 ;
        /*0030*/                   IDP.4A.U8.U8 R9, R6, R7, R9 ;
        /*0040*/               @P0 BRA `(.L_x_2) ;
        /*0050*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0060*/              @!P1 BRA `(.L_x_1) ;
        /*0070*/                   BRA `(.L_x_3) ;
.L_x_3:
        /*0080*/                   EXIT ;
	.section	.text.k_two,"ax",@progbits
k_two:
.text.k_two:
        /*0000*/                   HFMA2.MMA.BF16_V2 R1, R2, R3, R1 ;
        /*0010*/                   EXIT ;
"""


def test_kernels_opcodes_and_nested_loops():
    k = sc.parse_sass(SAMPLE)
    assert sorted(k) == ["k_outer", "k_two"]
    assert [op for _, _, op, _ in k["k_outer"]] == ["MOV", "LDS", "FFMA", "IDP", "BRA", "IADD3", "BRA", "BRA", "EXIT"]
    assert [op for _, _, op, _ in k["k_two"]] == ["HFMA2", "EXIT"]
    lp = sc.loops(k["k_outer"])
    # the inner loop first, with its 3 instructions; the outer loop's own 3 exclude them; the forward
    # branch to .L_x_3 is no loop
    assert [(x["label"], x["length"], x["own"]) for x in lp] == [(".L_x_2", 3, 3), (".L_x_1", 6, 3)]
    assert lp[0]["opcodes"] == {"FFMA": 1, "IDP": 1, "BRA": 1}
    assert lp[1]["opcodes"] == {"LDS": 1, "IADD3": 1, "BRA": 1}


def test_resource_usage_lines():
    text = ("Resource usage:\n Common:\n  GLOBAL:0\n Function cpemu_gemm_rzacc_pre:\n"
            "  REG:168 STACK:48 SHARED:0 LOCAL:0 CONSTANT[0]:708 TEXTURE:0 SURFACE:0 SAMPLER:0\n")
    assert sc.resource_usage(text) == {
        "cpemu_gemm_rzacc_pre": {"registers": 168, "stack": 48, "shared_bytes": 0, "local_bytes": 0}}
