"""Command-line entry of cpemu.recording.splitk_table (see its docstring)."""

from cpemu.recording.splitk_table import cli

if __name__ == "__main__":
    cli()
