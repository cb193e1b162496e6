"""A run's files: the run directory, checkpoints, metrics, train data, fates, the audit and the report.

Everything here reads or writes ``runs/<name>/``; nothing here trains. Reading a run (audit, report, metrics)
imports neither torch nor Ray, so those commands start fast.
"""
