"""Benchmarks, reports and figures around rapid (`python tools/<name>.py`); importable as `tools.<name>`.

tools/stats.py holds the statistics the others share (bootstrap, Wilson and Student t intervals)."""
