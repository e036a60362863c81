"""noisescope's benchmarks: `python -m benchmarks [--quick] [--only NAME ...]`."""
