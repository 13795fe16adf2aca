"""The ``contend`` command line."""
