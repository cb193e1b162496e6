"""The ``groupwise`` command line: the entry point (:mod:`groupwise.cli.main`), one module of commands
(:mod:`groupwise.cli.commands`) and the console progress display (:mod:`groupwise.cli.progress`)."""
