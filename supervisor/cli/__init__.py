"""The ``toolhost`` command line."""
