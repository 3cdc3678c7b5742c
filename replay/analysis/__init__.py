"""Analysis: pure functions on polars frames (no plotting, no I/O beyond the bundle reader)."""
