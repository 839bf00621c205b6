"""Readers for the real data sets' formats (the synthetic world is written in the same ones)."""
