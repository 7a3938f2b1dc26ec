"""Command-line entry of cpemu.recording.fit (see its docstring)."""

from cpemu.recording.fit import main

if __name__ == "__main__":
    main()
