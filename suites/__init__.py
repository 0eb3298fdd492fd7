"""kvx-conform's test suites (installed as ``kvx_conformance.suites``).

``conformance/`` holds the spec-traced conformance tests, one module per spec
section; ``engine/`` the engine-shaped scenarios (profile ``engines``,
docs/engine-suites.md); the pytest plugin (``kvx_conformance.plugin``) supplies the
provider and the run's options as fixtures.
"""
