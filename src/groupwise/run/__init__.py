"""A run's files and console: the run directory, checkpoints, metrics, train data, fates, the audit, the report and
the progress display.

Everything here reads or writes ``runs/<name>/`` (or shows a run's progress); nothing here trains. Reading a run
(audit, report, metrics) imports neither torch nor Ray, so those commands start fast.
"""
