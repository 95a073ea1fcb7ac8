"""Benchmarks for dataservice (not part of the installed package)."""
