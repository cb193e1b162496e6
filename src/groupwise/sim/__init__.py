"""The simulator: the real async controller or the real sync loop in virtual time against a simulated
generator and learner, for throughput evidence and invariant fuzzing at a scale no real machine here reaches.

Modules: ``workload`` (the toy cost model and the learning model), ``slots`` (the toy engine's completion slots),
``variates`` (seeded random draws), ``simulated_rollouts`` (the toy ``RolloutClient``), ``simulated_learner`` (the
toy ``TrainerClient``); the job model (``sim.job``, docs/simulator.md): ``gpus`` (the spec table), ``job_model``
(the cost formulas), ``step_time`` (decode time between events), ``job_lengths`` (completion lengths),
``replica`` (one continuous-batching replica), ``job_engine`` (the replicas in time order), ``job_rollouts`` (its
``RolloutClient`` and ``TrainerClient``), ``job_checks`` (what it refuses); ``virtual_time`` (looptime), ``meter``
(per-step perf metrics), ``simulation`` (one run, no files), ``summary`` (``sim/summary.json``), ``run``
(``groupwise simulate``: a config in, a run directory out), ``plan`` and ``plan_plot`` (``groupwise plan``).
Imports neither torch nor Ray.
"""
