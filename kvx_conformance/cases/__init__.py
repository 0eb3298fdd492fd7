"""Cases: takes descriptors and a provider, gives cases (built, generated or drawn by hypothesis),
their execution on the provider and their comparison with the numpy oracle.
"""
