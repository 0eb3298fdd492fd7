"""The provider as Python sees it: takes a provider .so, gives the loaded provider (ctypes mirror of
the header, library loading, native paths), dtypes, descriptors and guarded buffers.
"""
