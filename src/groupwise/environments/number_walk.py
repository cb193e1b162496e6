"""``number_walk``: walk along the number line to a goal, one step up or down per turn.

The prompt's ``answer`` is the goal and its ``start`` field (``Prompt.metadata["start"]``) where the walk begins.
Each model turn moves one step: to the reply's last number when that is a neighbour of the position, else up or
down by the reply's last ``up`` or ``down``; a reply with neither uses a move and stays put. The environment
answers with the new position and the two numbers it can move to (in an order drawn from the position, the goal
and the moves left, so that the first is the nearer one half of the time: taking the first is a random walk), or
ends the episode at the goal. With ``nearer_first`` the move toward the goal is always offered first, a guide: the
direction is given, and what is left to learn is to take a move every turn. Reward ``1 + bonus × (max_moves − moves
used)`` at the goal, 0 when the moves run out; with ``progress_reward`` r > 0 each move also pays ``r × (distance
before − distance after)``: +r toward the goal, −r away.

Why the progress term: without it a group whose walks all lose carries no signal (every reward 0), so a policy that
always moves the same way (up, say) wins the walks that go that way in the fewest moves, loses every other walk,
and nothing trains against it: its moves per won walk fall while it never learns to read the goal. With it, a lost
walk's reward is ``r × (distance at the start − distance at the end)``, which differs between the walks of a group
that moved differently. A won walk's progress is its whole distance whatever its path (the term is a potential
difference), so the ranking of won walks stays the bonus's. ``r × distance`` must stay below 1 so that a lost walk
never reaches the reward that counts a walk as solved.

Unlike a secret to guess, every game here has one shortest solution, ``|goal − start|`` moves, and every move in
the wrong direction (or that does not move) costs two more (one): a won walk's moves are its distance plus what the
policy wasted on the way. The mean over won walks still depends on which walks are won within the moves allowed: a
policy that starts to answer with a number wins walks with a detour it used to lose.
"""

from __future__ import annotations

import random
import re

from groupwise.episodes.environment import Message, StepResult
from groupwise.types import Prompt

_MOVE = re.compile(r"\b(up|down)\b", re.IGNORECASE)
_INTEGER = re.compile(r"-?\d+")


def next_move(reply: str, position: int) -> int:
    """+1 or −1: to the reply's last integer when it is ``position ± 1``, else by its last ``up`` or ``down`` (any
    case); 0 for a reply with neither."""
    numbers = _INTEGER.findall(reply)
    if numbers and abs(int(numbers[-1]) - position) == 1:
        return int(numbers[-1]) - position
    words = _MOVE.findall(reply)
    if not words:
        return 0
    return 1 if words[-1].lower() == "up" else -1


def choices(position: int, goal: int, moves_left: int, nearer_first: bool = False) -> tuple[int, int]:
    """The two numbers ``position`` can move to: the one toward ``goal`` first when ``nearer_first``, else in an
    order drawn from the three arguments (the same in every process, so a replayed episode reads the same answers)
    that never tells which is nearer the goal."""
    low, high = position - 1, position + 1
    if nearer_first:
        return (high, low) if goal > position else (low, high)
    return (low, high) if random.Random(f"{position}/{goal}/{moves_left}").random() < 0.5 else (high, low)


def position_message(position: int, goal: int, moves_left: int, nearer_first: bool = False) -> str:
    """What the model reads after a move that did not reach the goal."""
    first, second = choices(position, goal, moves_left, nearer_first)
    return f"You are on {position}; the goal is {goal}. {moves_left} moves left. Move to {first} or {second}?"


class NumberWalkEnvironment:
    """One walk per episode: from ``prompt.metadata["start"]`` to ``int(prompt.answer)``."""

    def __init__(self, max_moves: int = 8, bonus: float = 0.1, progress_reward: float = 0.0,
                 nearer_first: bool = False) -> None:
        if max_moves < 1:
            raise ValueError(f"max_moves must be ≥ 1, got {max_moves}")
        if progress_reward < 0:
            raise ValueError(f"progress_reward must be ≥ 0, got {progress_reward}")
        self.max_moves, self.bonus, self.progress_reward = max_moves, bonus, progress_reward
        self.nearer_first = nearer_first
        self.position = self.goal = self.moves = 0

    def reset(self, prompt: Prompt, sample_index: int) -> list[Message]:
        if "start" not in prompt.metadata:
            raise ValueError(f"prompt {prompt.uid!r} has no 'start' field: number_walk needs where the walk begins")
        self.position, self.goal, self.moves = int(prompt.metadata["start"]), int(prompt.answer), 0
        distance = abs(self.goal - self.position)
        if self.progress_reward * distance >= 1.0:
            raise ValueError(f"prompt {prompt.uid!r}: progress_reward {self.progress_reward} × distance {distance} "
                             "≥ 1 would count a lost walk as solved; lower progress_reward")  # fmt: skip
        if prompt.messages is not None:
            return [dict(m) for m in prompt.messages]
        return [{"role": "user", "content": prompt.text or ""}]

    def step(self, assistant_message: Message) -> StepResult:
        move = next_move(assistant_message["content"], self.position)
        before = abs(self.goal - self.position)
        self.position += move
        self.moves += 1
        left = self.max_moves - self.moves
        progress = self.progress_reward * (before - abs(self.goal - self.position))
        if self.position == self.goal:
            return StepResult(reward=1.0 + self.bonus * left + progress, done=True, info={"solved": 1})
        if left <= 0:
            return StepResult(reward=progress, done=True)
        text = position_message(self.position, self.goal, left, self.nearer_first)
        if move == 0:
            text = "Reply with the number you move to. " + text
        return StepResult(messages=[{"role": "user", "content": text}], reward=progress)
