"""Which prompts a run trained on: what ``groupwise audit`` checks a run's fates against.

A trained run's prompts are its task's training split; a simulated run's are the simulator's workload. Both are
rebuilt from the run's resolved ``config.yaml`` (a task and a workload are deterministic in the run seed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from groupwise.config import RunConfig


def training_uids(cfg: RunConfig, simulated: bool) -> list[str]:
    """The uids of the prompts the run trained on: the task's, or the simulator's for a simulated run."""
    if simulated:
        from groupwise.sim.workload import SimWorkload, make_sim_prompts

        prompts, _ = make_sim_prompts(SimWorkload.from_config(cfg))
        return [prompt.uid for prompt in prompts]
    from groupwise.data.registry import build_task

    return [prompt.uid for prompt in build_task(cfg.data.task, cfg.data, cfg.run.seed).train_prompts()]
