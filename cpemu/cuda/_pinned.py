"""sha256 of bin/manifest.json (packaged as cpemu/bin/manifest.json).

Written by tools/build_fatbin.py together with the manifest; do not edit by hand.
cpemu.cuda.loader refuses a manifest whose sha256 differs, and the manifest pins the
sha256 of every fatbin.
"""

MANIFEST_SHA256 = "1bc7ee86927c21beefc7e1ece3e8c34baa9e3b7058219112262369e4a20244c2"
