"""Test session settings."""

import os

# Under pytest-xdist every worker is a process of its own: one reference thread each keeps the
# machine from being oversubscribed (tests that need more threads pass them explicitly).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("CPEMU_THREADS", "1")
