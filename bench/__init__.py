"""Benchmarks: figures measured side by side, never timed tests."""
