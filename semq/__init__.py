"""SEMQ: store-and-forward messaging between organizations over UMX-T."""

__all__ = ["__version__"]

__version__ = "0.1.0"
