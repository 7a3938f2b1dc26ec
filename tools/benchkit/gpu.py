"""The GPU a benchmark runs on: cupy's device, torch on cupy's stream, the cuBLASLt torch loaded."""

from __future__ import annotations

import ctypes


def device_info(cp) -> dict:
    """Name, SM count, compute capability, PCI bus id, driver/runtime of cupy's current device."""
    dev = cp.cuda.Device()
    info = {"index": int(dev.id)}
    try:
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
    except Exception as e:  # noqa: BLE001
        props, info["properties_error"] = {}, str(e)
    name = props.get("name")
    info["name"] = name.decode(errors="replace") if isinstance(name, (bytes, bytearray)) else name
    info["sm_count"] = _sm_count(cp, dev, props, info)
    for key, fn in (("compute_capability", lambda: dev.compute_capability),
                    ("pci_bus_id", lambda: dev.pci_bus_id),
                    ("cuda_driver_version", lambda: cp.cuda.runtime.driverGetVersion()),
                    ("cuda_runtime_version", lambda: cp.cuda.runtime.runtimeGetVersion()),
                    ("total_memory_bytes", lambda: props.get("totalGlobalMem")),
                    ("l2_cache_bytes", lambda: props.get("l2CacheSize"))):
        try:
            info[key] = fn()
        except Exception as e:  # noqa: BLE001
            info[key] = None
            info[key + "_error"] = str(e)
    return info


def _sm_count(cp, dev, props: dict, info: dict) -> int | None:
    """The SM count, from cupy's attributes, the runtime or the properties (info["sm_count_source"])."""
    sm = None
    try:
        sm = int(dev.attributes["MultiProcessorCount"])
        info["sm_count_source"] = "cupy Device.attributes['MultiProcessorCount']"
    except Exception:  # noqa: BLE001
        try:
            sm = int(cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrMultiProcessorCount, dev.id))
            info["sm_count_source"] = "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)"
        except Exception:  # noqa: BLE001
            if props.get("multiProcessorCount"):
                sm = int(props["multiProcessorCount"])
                info["sm_count_source"] = "getDeviceProperties()['multiProcessorCount']"
    return sm


def torch_device(torch, index: int):
    """The torch device of cupy's current device."""
    return torch.device("cuda", index)


def torch_dtype(torch, out_dtype: str):
    """The torch dtype of an output dtype name."""
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[out_dtype]


def torch_on_stream(torch, info: dict, stream):
    """torch's device of cupy's device and a torch stream on the cupy ``stream``; records torch's
    versions and device name in ``info``."""
    info["torch"] = torch.__version__
    info["torch_cuda"] = getattr(torch.version, "cuda", None)
    try:
        info["torch_device_name"] = torch.cuda.get_device_name(info["index"])
    except Exception as e:  # noqa: BLE001
        info["torch_device_name"] = f"error: {e}"
    device = torch_device(torch, info["index"])
    return device, torch.cuda.ExternalStream(stream.ptr, device=device)


def first_scaled_mm(torch, device, tstream, stream, out_dtype: str, fast_accum: bool) -> None:
    """One small torch._scaled_mm on the stream, so that no timed first call pays for loading cuBLASLt."""
    t = torch
    x = t.zeros((16, 32), dtype=t.uint8, device=device).view(t.float8_e4m3fn)
    y = t.zeros((16, 32), dtype=t.uint8, device=device).view(t.float8_e4m3fn)
    one = t.ones((), dtype=t.float32, device=device)
    with t.cuda.stream(tstream), stream:
        t._scaled_mm(x, y.t(), one, one, out_dtype=torch_dtype(t, out_dtype), use_fast_accum=fast_accum)
        stream.synchronize()
    t.cuda.synchronize(device)


def cublaslt_info() -> dict:
    """The libcublasLt torch loaded (after its first FP8 matmul) and its cublasLtGetVersion()."""
    from cpemu.cuda.cublaslt import loaded_libs

    info = {"loaded": loaded_libs("libcublasLt.so"), "version": None}
    for path in info["loaded"][:1]:
        try:
            fn = ctypes.CDLL(path).cublasLtGetVersion
            fn.restype, fn.argtypes = ctypes.c_size_t, []
            info["version"] = int(fn())
        except Exception as e:  # noqa: BLE001
            info["error"] = f"{type(e).__name__}: {e}"
    return info
