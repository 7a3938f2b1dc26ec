"""sha256 of bin/manifest.json (packaged as cpemu/bin/manifest.json).

Written by tools/build_fatbin.py together with the manifest; do not edit by hand.
cpemu.cuda.loader refuses a manifest whose sha256 differs, and the manifest pins the
sha256 of every fatbin.
"""

MANIFEST_SHA256 = "0de0a5f3b102d6f2d8ec6c802de294b46142ee398ad7495c63bdf15f726007be"
