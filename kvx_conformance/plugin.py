"""``-p kvx_conformance.plugin``: the pytest plugin, :mod:`kvx_conformance.harness.plugin` (the path
vendors' CI passes to pytest)."""
import sys

from .harness import plugin as _plugin

sys.modules[__name__] = _plugin
