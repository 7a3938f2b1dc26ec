"""Command-line entry of cpemu.recording.import_truth (see its docstring)."""

from cpemu.recording.import_truth import main

if __name__ == "__main__":
    main()
