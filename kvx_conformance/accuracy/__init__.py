"""KV-cache accuracy benchmark: FP4 (NVFP4, MXFP4) against BF16, FP8 and integer KV caches."""
from __future__ import annotations

from .runner import (
    FULL,
    QUICK,
    ROW_KEYS,
    BenchConfig,
    ProviderAccuracyError,
    ProviderAccuracyUnavailable,
    format_table,
    provider_roundtrip,
    run_accuracy,
)

__all__ = [
    "FULL",
    "QUICK",
    "ROW_KEYS",
    "BenchConfig",
    "ProviderAccuracyError",
    "ProviderAccuracyUnavailable",
    "format_table",
    "provider_roundtrip",
    "run_accuracy",
]
