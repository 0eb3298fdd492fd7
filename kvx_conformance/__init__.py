"""kvx-conform: conformance, benchmark and accuracy suite for KVX providers."""

__version__ = "0.1.0"
