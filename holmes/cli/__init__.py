"""The ``holmes`` command line: a thin layer over the library."""
