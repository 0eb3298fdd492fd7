"""``python -m kvx_conformance.mutants``: the mutant kill test, :mod:`kvx_conformance.harness.mutants`."""
import sys

from .harness import mutants as _mutants

if __name__ == "__main__":
    sys.exit(_mutants.main())
sys.modules[__name__] = _mutants
