"""The trainer: the sync loop, the learner, the rollout worker (generate + score groups), the session that holds a
run's components, the builder that makes one from a config, evaluation and the supervised warm start."""
