"""The ``groupwise`` command line: the entry point (:mod:`groupwise.cli.main`), one module of commands
(:mod:`groupwise.cli.commands`, with the run summary :mod:`groupwise.cli.run_summary`)."""
