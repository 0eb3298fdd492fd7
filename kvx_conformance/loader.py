"""``kvx_conformance.loader`` is :mod:`kvx_conformance.abi.loader` (the old path, kept for vendors' code)."""
import sys

from .abi import loader as _loader

sys.modules[__name__] = _loader
