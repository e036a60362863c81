"""``python -m noisescope_server``: run the HTTP server (same options as ``noisescope server``)."""

from __future__ import annotations

import sys

from noisescope_server.cli import main

if __name__ == "__main__":
    sys.exit(main())
