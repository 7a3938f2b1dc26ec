"""Command-line entry of cpemu.recording.splitk_enum (see its docstring)."""

from cpemu.recording.splitk_enum import cli

if __name__ == "__main__":
    cli()
