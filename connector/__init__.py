"""Readers of Strata topics: the chunk-aware range reader (reader.py) and the PySpark source."""
