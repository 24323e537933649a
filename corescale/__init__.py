"""corescale: how to deploy a transformer on this CPU (or the one you should buy)."""

__version__ = "0.2.0"
