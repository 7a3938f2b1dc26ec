"""Command-line entry of cpemu.recording.cublaslt_heuristic (see its docstring)."""

from cpemu.recording.cublaslt_heuristic import cli

if __name__ == "__main__":
    cli()
