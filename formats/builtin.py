"""Registers the built-in formats (filled in by the format modules)."""
