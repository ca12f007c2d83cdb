"""Operator tools (kafka-*.sh clones) and the dev cluster launcher."""
