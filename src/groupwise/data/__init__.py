"""Tasks and datasets, reward functions, scoring, and the deterministic prompt loader."""

from groupwise.data.addition import AdditionTask
from groupwise.data.countdown import CountdownTask
from groupwise.data.jsonl_dataset import DatasetError, JsonlTask, load_jsonl_prompts
from groupwise.data.loader import LoadedPrompt, PromptLoader, epoch_order
from groupwise.data.registry import TASKS, Task, build_task
from groupwise.data.rewards import (
    BUILTIN_REWARDS,
    RewardFn,
    RewardSpecError,
    check_reward_kwargs,
    countdown,
    exact_numeric,
    final_number,
    load_reward_fn,
    math_verify,
)
from groupwise.data.scoring import RewardError, score_completions

__all__ = [
    "BUILTIN_REWARDS",
    "TASKS",
    "AdditionTask",
    "CountdownTask",
    "DatasetError",
    "JsonlTask",
    "LoadedPrompt",
    "PromptLoader",
    "RewardError",
    "RewardFn",
    "RewardSpecError",
    "Task",
    "build_task",
    "check_reward_kwargs",
    "countdown",
    "epoch_order",
    "exact_numeric",
    "final_number",
    "load_jsonl_prompts",
    "load_reward_fn",
    "math_verify",
    "score_completions",
]
