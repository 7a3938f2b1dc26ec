"""sha256 of bin/manifest.json (packaged as cpemu/bin/manifest.json).

Written by tools/build_fatbin.py together with the manifest; do not edit by hand.
cpemu.cuda.loader refuses a manifest whose sha256 differs, and the manifest pins the
sha256 of every fatbin.
"""

MANIFEST_SHA256 = "666f5236982c336dc7d2c0b36c5b68cf0ba3bf38475e8a43939aed30405d4794"
