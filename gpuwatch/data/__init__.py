"""Bundled data: the demo recording."""
