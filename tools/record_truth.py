"""Command-line entry of cpemu.recording.truth_recorder (see its docstring)."""

from cpemu.recording.truth_recorder import cli

if __name__ == "__main__":
    cli()
