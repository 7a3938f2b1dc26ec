"""The prebuilt CUDA fatbins and their manifest (built by tools/build_fatbin.py)."""
