"""Command-line entry of cpemu.recording.splitk_rule (see its docstring)."""

from cpemu.recording.splitk_rule import main

if __name__ == "__main__":
    main()
