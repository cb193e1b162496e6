"""The ``groupwise`` command line.

Each command lives in its own pair of functions: ``add_<command>_parser(subparsers)`` declares its arguments
and sets ``handler`` to a ``run_<command>(args) -> int`` function; :data:`COMMAND_PARSERS` lists the
``add_*`` functions. To add a command, write the pair and append the ``add_*`` function to the list.
Heavy imports (torch, transformers) belong inside the ``run_*`` functions so ``groupwise --help`` and
``groupwise config`` stay fast and work without them.

Exit codes: 0 success, 1 a run that failed, 2 bad usage or an invalid config (every problem printed, never a
traceback). The console script is :func:`run_as_process`.

:func:`main` sets the OpenMP wait policy before any command imports torch (see
:mod:`groupwise.trainer.cpu_threads`: libgomp reads it only when torch loads it).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from groupwise.abandoned import exit_process
from groupwise.cli.commands import RUN_COMMAND_PARSERS, print_config_warnings, print_warnings
from groupwise.cli.plan import add_plan_parser
from groupwise.config import ConfigError, load_config
from groupwise.trainer.cpu_threads import prepare_openmp_environment

EXIT_OK = 0
EXIT_CONFIG_ERROR = 2

Subparsers = argparse._SubParsersAction  # what add_subparsers() returns; argparse has no public name for it
Handler = Callable[[argparse.Namespace], int]


def add_config_file_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``FILE [KEY=VALUE ...]`` arguments every config-reading command takes."""
    parser.add_argument("file", metavar="FILE", help="YAML config file")
    parser.add_argument(
        "overrides", metavar="KEY=VALUE", nargs="*",
        help="dotted overrides parsed as YAML values, e.g. grpo.num_prompts_per_step=8 loss.epsilon_high=0.28",
    )


# --- groupwise config -------------------------------------------------------------------------------------------


def add_config_parser(subparsers: Subparsers) -> None:
    """``groupwise config show|check FILE [KEY=VALUE ...]``."""
    parser = subparsers.add_parser("config", help="show or check a config file",
                                   description="Show the resolved config or check it for errors.")
    actions = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print the resolved config (every key, defaults included) as YAML")
    add_config_file_arguments(show)
    show.set_defaults(handler=run_config_show)
    check = actions.add_parser(
        "check", help="exit 0 when the config is valid and its model, data, reward and output directory are usable, "
        "else 2 with every error",
    )
    add_config_file_arguments(check)
    check.set_defaults(handler=run_config_check)


def run_config_show(args: argparse.Namespace) -> int:
    """Print the resolved config; a ``ConfigError`` propagates to :func:`main` (exit 2)."""
    config = load_config(args.file, args.overrides)
    print_config_warnings(config)  # stderr: the YAML on stdout stays loadable
    sys.stdout.write(config.to_yaml())
    return EXIT_OK


def run_config_check(args: argparse.Namespace) -> int:
    """Print ``ok: FILE`` when the config is valid and what it points at is usable (reward and sampler import, data
    files parse, the model path exists, the run directory can be written); a ``ConfigError`` listing every problem
    propagates to :func:`main` (exit 2). Hazards (valid settings known to end runs badly) are printed as warnings.

    A config with ``sim.job`` describes a job to simulate, not one to train: it is checked as ``groupwise plan``
    checks it (the two accept the same configs), since its model, task and reward are never loaded."""
    config = load_config(args.file, args.overrides)
    if config.sim.job is not None:
        from groupwise.sim.plan import plan_issues

        if issues := plan_issues(config):
            raise ConfigError(issues)
        warnings = print_config_warnings(config)
        print(f"ok: {args.file} (a job for groupwise plan and simulate: checked as groupwise plan checks it)"
              + (f" ({len(warnings)} warning(s) above)" if warnings else ""))  # fmt: skip
        return EXIT_OK
    from groupwise.trainer.preflight import check_inputs  # imports the task and reward code, never torch

    inputs = check_inputs(config)
    warnings = print_config_warnings(config) + print_warnings(inputs.warnings)
    print(f"ok: {args.file}" + (f" ({len(warnings)} warning(s) above)" if warnings else ""))
    return EXIT_OK


# --- entry point ------------------------------------------------------------------------------------------------

COMMAND_PARSERS: list[Callable[[Subparsers], None]] = [add_config_parser, *RUN_COMMAND_PARSERS, add_plan_parser]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per entry of :data:`COMMAND_PARSERS`."""
    parser = argparse.ArgumentParser(
        prog="groupwise",
        description="Train causal language models with GRPO and DAPO dynamic sampling (sync or async).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_parser in COMMAND_PARSERS:
        add_parser(subparsers)
    return parser


# FutureWarnings of the libraries under us (and those attributed to our calls into them) are about our code, not
# the user's: they tell a developer what to change before a release, and a user can do nothing about them.
LIBRARY_WARNINGS = r"(transformers|torch|peft|accelerate|huggingface_hub|tokenizers|gguf|groupwise)(\.|$)"


def quiet_library_output() -> None:
    """Keep the libraries' own progress bars, info logs and FutureWarnings off the console: each command prints its
    own phase lines, progress and summary, which the libraries' output would interleave with. Each switch is set
    only where the user has not set it (``HF_HUB_DISABLE_PROGRESS_BARS=0`` brings the loading bars back,
    ``TRANSFORMERS_VERBOSITY=warning`` transformers' warnings); they must be set before those libraries import."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' and the Hub's bars
    os.environ.setdefault("TQDM_DISABLE", "1")  # bars that call tqdm directly (GGUF dequantisation)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning, module=LIBRARY_WARNINGS)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code (the ``groupwise`` console script)."""
    prepare_openmp_environment()
    quiet_library_output()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2); return the code instead
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_CONFIG_ERROR
    handler: Handler = args.handler
    try:
        return handler(args)
    except ConfigError as exc:
        if exc.source is None and isinstance(getattr(args, "file", None), str):
            exc = ConfigError(exc.errors, source=args.file)  # a check made after loading: still name the file
        print(exc, file=sys.stderr)
        return EXIT_CONFIG_ERROR


def run_as_process() -> None:
    """The ``groupwise`` console script: :func:`main`, then the process ends with its exit code — without the
    interpreter teardown that would abort it (exit 134) while a call left running after a stall is still on its
    thread (:mod:`groupwise.abandoned`)."""
    exit_process(main())


if __name__ == "__main__":
    run_as_process()
