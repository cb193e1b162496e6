"""The simulator: the real async controller or the real sync loop in virtual time against a simulated
generator and learner, for throughput evidence and invariant fuzzing at a scale no real machine here reaches.

Modules: ``workload`` (the cost and learning model), ``slots`` (the engine's completion slots), ``variates``
(seeded random draws), ``simulated_rollouts`` (the simulated ``RolloutClient``), ``simulated_learner`` (the
simulated ``TrainerClient``), ``virtual_time`` (looptime), ``meter`` (per-step perf metrics), ``simulation`` (one
run, no files), ``summary`` (``sim/summary.json``) and ``run`` (``groupwise simulate``: a config in, a run
directory out). Imports neither torch nor Ray.
"""
