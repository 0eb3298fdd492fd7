"""The harness: takes a provider path and the suites, gives a finished run: preflight, pytest with
the kvx plugin in worker processes, results, certificate, reports; and the mutant kill test.
"""
