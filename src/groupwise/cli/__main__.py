"""``python -m groupwise.cli``: the same as the ``groupwise`` command."""

from groupwise.cli.main import run_as_process

if __name__ == "__main__":
    run_as_process()
