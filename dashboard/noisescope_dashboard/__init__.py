"""noisescope."""
