"""Running a session: the sync loop (``sync_run``) or the async controller (``async_run``), on clients that are
in-process (``embedded``, the default) or Ray actors (the ``ray`` subpackage, the only modules that import Ray)."""
