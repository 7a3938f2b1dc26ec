"""cpemu's CUDA kernels, shipped as prebuilt SASS fatbins (``cpemu.bin``).

Importing this package needs neither cupy nor a GPU: cupy is imported only when a
module is checked against a device or loaded. ``module_status(name)`` says whether a
module can run here and why not; ``get_function(module, kernel)`` returns a verified,
cached ``cupy.RawKernel``. See :mod:`cpemu.cuda.loader` for the verification rules.
The ``cublaslt-tc`` backend (:mod:`cpemu.cuda.tensorcore`) calls cuBLASLt through
:mod:`cpemu.cuda.cublaslt`, the package's own binding.
"""

from .loader import (FatbinError, arch_compatible, get_function, get_module, load_manifest, module_status,
                     modules)

__all__ = ["FatbinError", "arch_compatible", "get_function", "get_module", "load_manifest", "module_status",
           "modules"]
