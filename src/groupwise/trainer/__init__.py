"""The trainer: the sync loop (generic over its rollout and trainer clients), the learner, the rollout worker
(generate + score groups), the session that holds a run's parts (and the protocols they satisfy), the builder that
makes one from a config, evaluation and the supervised warm start."""
