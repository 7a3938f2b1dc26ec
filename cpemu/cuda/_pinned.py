"""sha256 of bin/manifest.json (packaged as cpemu/bin/manifest.json).

Written by tools/build_fatbin.py together with the manifest; do not edit by hand.
cpemu.cuda.loader refuses a manifest whose sha256 differs, and the manifest pins the
sha256 of every fatbin.
"""

MANIFEST_SHA256 = "cb6ff4c46e1ecdf4cf0af53d6a05728eff8d112be72aeec5be3814e1663e9037"
