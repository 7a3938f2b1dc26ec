"""sha256 of bin/manifest.json (packaged as cpemu/bin/manifest.json).

Written by tools/build_fatbin.py together with the manifest; do not edit by hand.
cpemu.cuda.loader refuses a manifest whose sha256 differs, and the manifest pins the
sha256 of every fatbin.
"""

MANIFEST_SHA256 = "ae2aca834b64d08b6d96c43028f6834a97bd6c923207a8e81fff6b2a2ab8aeac"
