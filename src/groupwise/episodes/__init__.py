"""Multi-turn episodes: the model writes, an environment answers, only the model's tokens train.

An :class:`~groupwise.episodes.environment.Environment` speaks messages, never tokens; an
:class:`~groupwise.episodes.episode.Episode` turns its answers into tokens with the chat template and keeps the
sampled tokens exactly as sampled; :mod:`groupwise.episodes.lockstep` runs the G episodes of many prompt groups
turn by turn on any generator. docs/environments.md explains the protocol and the token rules.
"""
