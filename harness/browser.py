"""Headless Debian Chromium for the tests and the reliability harness (never a downloaded one).

The flags keep Chromium off the network it cannot reach here and out of a sandbox that
needs privileges a root CI run does not grant.
"""

from __future__ import annotations

__all__ = ["CHROMIUM_ARGS"]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
