"""Plug-in tasks for the registry tests (``data.task: "plugin_tasks:<Class>"``): fakes named as such."""

from __future__ import annotations

import random

from groupwise.types import Prompt


class DoublingTask:
    """``n*2=`` → ``2n``: a generated task with a seed and one setting."""

    name = "doubling"
    default_reward = "exact_numeric"

    def __init__(self, count: int = 20, seed: int = 0) -> None:
        numbers = list(range(count))
        random.Random(seed).shuffle(numbers)
        self._prompts = [Prompt(uid=f"doubling/{n}", answer=str(2 * n), text=f"{n}*2=") for n in numbers]

    def train_prompts(self) -> list[Prompt]:
        return self._prompts[4:]

    def eval_prompts(self) -> list[Prompt]:
        return self._prompts[:4]

    def demonstration(self, prompt: Prompt) -> str:
        return prompt.answer


class RaisingTask(DoublingTask):
    def __init__(self, count: int = 20, seed: int = 0) -> None:
        raise RuntimeError("the task's data server is down")


class NotATask:
    def __init__(self) -> None:
        self.name = "not a task"


class SplitsRaiseTask(DoublingTask):
    def train_prompts(self) -> list[Prompt]:
        raise ConnectionError("the prompt server refused the connection")


class DictsTask(DoublingTask):
    def train_prompts(self) -> list[Prompt]:
        return [{"uid": p.uid, "answer": p.answer, "text": p.text} for p in super().train_prompts()]


class GeneratorTask(DoublingTask):
    def train_prompts(self):
        return (p for p in super().train_prompts())


class IntAnswerTask(DoublingTask):
    def train_prompts(self) -> list[Prompt]:
        return [Prompt(uid=p.uid, answer=int(p.answer), text=p.text) for p in super().train_prompts()]


class NoTextTask(DoublingTask):
    def eval_prompts(self) -> list[Prompt]:
        return [Prompt(uid=p.uid, answer=p.answer) for p in super().eval_prompts()]


class DuplicateUidTask(DoublingTask):
    def train_prompts(self) -> list[Prompt]:
        return [Prompt(uid="same", answer=p.answer, text=p.text) for p in super().train_prompts()]


class EvalIsTrainTask(DoublingTask):
    def eval_prompts(self) -> list[Prompt]:
        return [Prompt(uid=f"eval/{p.uid}", answer=p.answer, text=p.text) for p in self.train_prompts()[:4]]
