"""Kernel families, one module each: its config type, validity predicate and launcher."""
