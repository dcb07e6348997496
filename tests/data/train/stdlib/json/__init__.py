"""Fixture package standing in for the standard library's json (held out in the tests)."""

from .decoder import parse_flag

__all__ = ["parse_flag"]
