"""The ``opdump`` command line: a thin layer over the Python API."""
