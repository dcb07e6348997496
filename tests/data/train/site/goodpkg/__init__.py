"""goodpkg: an MIT-licensed fixture distribution."""

from .core import greet
