"""The async single controller: buffer, samplers, ledger, spare pool, dispatch slots, pumps (docs/design.md).

Modules are one concept each; only runtimes and the CLI import ``groupwise.controller.controller``.
"""
