"""Results: takes the outcomes of finished tests, claims and waivers, gives results.json, the
verdicts per profile and engine, and the certificate.
"""

# ``kvx_conformance.results`` was the results.json module: its names stay importable from here.
from .record import *  # noqa: E402,F401,F403
