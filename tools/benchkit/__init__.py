"""Shared parts of the benchmark tools (``tools/bench_*.py``), one job per module.

- :mod:`benchkit.options`: argument parsing (shapes, M lists, data kinds, backends).
- :mod:`benchkit.provenance`: what identifies a record's code, packages and start time.
- :mod:`benchkit.records`: writing records (atomic JSON) and a tool's exit.
- :mod:`benchkit.timing`: the timed windows, on the GPU (CUDA events) and on the CPU.
- :mod:`benchkit.clocks`: the nvidia-smi sampler of SM clock, power and temperature.
- :mod:`benchkit.gpu`: the device, its stream, torch on that stream, the cuBLASLt torch loaded.
- :mod:`benchkit.exactness`: output bits, the reference's rows, bitwise comparison.
- :mod:`benchkit.launchers`: the one direct call of cpemu's CUDA kernels.

The modules named ``kernels_*`` hold the run of ``tools/bench_kernels.py`` itself.
The tools put this folder's parent (``tools/``) and the repository root on ``sys.path``.
"""

#: The operand format of every benchmark (a and b).
FMT = "e4m3"


def host_backend(name: str) -> bool:
    """Whether ``name`` is a backend of the ladder that runs on the CPU (numpy operands: the
    reference, cpu-fp32) rather than on the CUDA device."""
    from cpemu.backends import on_host

    return on_host(name)
