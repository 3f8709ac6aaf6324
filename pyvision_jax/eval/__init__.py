"""Benchmark evaluation and the HTML trajectory viewer."""
