"""Conformance suites, one module per spec section.

| module | spec | profile(s) |
| --- | --- | --- |
| ``test_s3_version`` | 3, 7 | core |
| ``test_s6_size_guards`` | 3, 6 (R-SIZE) | core, tables |
| ``test_s7_validation`` | 4.2, 5, 6, 7.1 (R-CACHE, R-IO, R-WRITE, R-GATHER, R-DATA) | core, layouts, tables, fp8 |
| ``test_s4_layouts`` | 4.2 (R-CACHE, R-CUSTOM) | core, layouts |
| ``test_s4_dtypes`` | 4.3, 6.9, 10 (R-CONVERT, R-FP8) | core, fp8 |
| ``test_s5_slots`` | 4.1, 5.2, 7 (R-WRITE) | core |
| ``test_s5_gather_tables`` | 5.1, 5.3, 6.10 (R-GATHER, R-DATA) | core, tables |
| ``test_s7_concurrency`` | 7, 7.2 (R-THREADS, R-LIFETIME, R-STREAM) | concurrency |
| ``test_robustness`` | 4.4, 6, 7, 8 | robustness |
| ``test_generated`` | all of the above, hypothesis-generated | generated |

Every test carries ``@conformance(id, clause, level, profile, entry, feature)``
(``kvx_conformance.results.outcomes``); every write and gather is compared bit-exactly
with the numpy oracle and its guards are checked (``kvx_conformance.cases.checks``).
"""
