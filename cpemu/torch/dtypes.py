"""torch dtypes as cpemu names them, and as torch's C++ error messages print them."""

from __future__ import annotations

import ml_dtypes
import torch

# torch float8 dtype -> (ml_dtypes dtype, cpemu format name)
_FP8 = {
    torch.float8_e4m3fn: (ml_dtypes.float8_e4m3fn, "e4m3"),
    torch.float8_e5m2: (ml_dtypes.float8_e5m2, "e5m2"),
}
_OUT = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

# c10::ScalarType names, as torch's C++ error messages print them.
_SCALAR_TYPE_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
    torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2",
}
for _name, _c10 in (("float8_e4m3fnuz", "Float8_e4m3fnuz"), ("float8_e5m2fnuz", "Float8_e5m2fnuz"),
                    ("float8_e8m0fnu", "Float8_e8m0fnu"), ("float4_e2m1fn_x2", "Float4_e2m1fn_x2")):
    if hasattr(torch, _name):
        _SCALAR_TYPE_NAMES[getattr(torch, _name)] = _c10
_FLOAT8_TYPES = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                 if hasattr(torch, n)}
_E8M0 = getattr(torch, "float8_e8m0fnu", None)
_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)


def _st(dtype) -> str:
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
