"""The Ray runtime (``runtime.backend: ray``): the session (``session``), the cluster and placement (``cluster``), the
actors (``actors``), the generation worker pool (``pool``), the controller's clients (``clients``; with continuous
batching ``stream_client`` over the workers' ``stream_worker``) and the errors the CLI catches (``errors``, importable
without Ray). Only these modules import Ray."""
