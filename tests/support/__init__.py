"""Test doubles shared by the unit tests and the benchmarks (importable as ``tests.support``)."""
