"""The async single controller: buffer, samplers, ledger, spare pool, pumps (seed 002).

Modules are one concept each; only runtimes and the CLI import ``groupwise.controller.controller``.
"""
