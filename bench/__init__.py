"""Benchmarks: `make bench` (full) or `python -m bench --quick`. Figures are ratios to a baseline
measured in the same run, so they mean the same on a fast laptop and a 2-core CI box."""
