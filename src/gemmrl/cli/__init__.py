"""`gemmrl` command line: one entry point (``main``), one module per subcommand, shared flags and errors in
``common``. Each subcommand is a thin shell over a typed function that the tests call directly."""
