"""cpemu: bit-exact emulation of the FP8 matrix products of named NVIDIA GPUs.

``cpemu.gemm`` computes what ``torch._scaled_mm`` returns on a profile's GPU (for
example the H200 with cuBLASLt 13.1), on the CPU. See README.md.
"""

from .api import BACKENDS, bits_to_float32, gemm
from .memory import OutputTooLarge
from .profile import DEFAULT_PROFILE, Profile, ProfileFeatureError, get_profile, profiles
from .schedule import UnsupportedShape

__version__ = "0.1.0"
__all__ = ["gemm", "profiles", "get_profile", "Profile", "ProfileFeatureError", "UnsupportedShape", "OutputTooLarge",
           "BACKENDS", "DEFAULT_PROFILE", "bits_to_float32", "__version__"]
