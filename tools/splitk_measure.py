"""Command-line entry of cpemu.recording.splitk_measure (see its docstring)."""

from cpemu.recording.splitk_measure import main

if __name__ == "__main__":
    main()
