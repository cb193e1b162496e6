"""Plain data that flows through groupwise: prompts, completions, groups, sampling settings.

The unit of work is the *prompt group*: one prompt, G completions, their rewards. A group id is
assigned at dispatch and travels with every row made from the group (invariant 2 in docs/design.md).
Nothing here holds behaviour beyond tiny derived properties.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from groupwise.episodes.record import EpisodeRecord

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SampleOutcome:
    """One evaluation sample: its raw reward and how many model turns it took (1 for a single completion)."""

    reward: float
    turns: int = 1


@dataclass(frozen=True)
class Prompt:
    """One dataset item. ``uid`` is stable across runs (``"<task>/<split>/<index>"``).

    Exactly one of ``text`` (a plain completion prompt) or ``messages`` (chat turns, rendered
    with the tokenizer's chat template) is set. ``answer`` is what the reward function checks.
    """

    uid: str
    answer: str
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class LoaderItem(Protocol):
    """One prompt as a prompt source yielded it: the prompt, the epoch it belongs to, and its index in that epoch's
    order (``groupwise.data.loader.LoadedPrompt`` is one)."""

    @property
    def prompt(self) -> Prompt: ...

    @property
    def epoch(self) -> int: ...

    @property
    def index_in_epoch(self) -> int: ...


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled. ``top_k == 0`` and ``top_p == 1.0`` disable those filters;
    ``temperature == 0`` means greedy."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()

    def as_data(self) -> dict[str, Any]:
        """The settings as JSON-able data (``stop`` as a list): what a checkpoint records, and compares on resume."""
        return {**asdict(self), "stop": list(self.stop)}


@dataclass(frozen=True)
class RowPrefix:
    """What one sample of a request already generated, to be continued rather than sampled again.

    ``token_ids`` with the ``logprobs`` recorded when each was sampled and the ``token_versions`` (weight versions)
    that produced them; ``finish_reason`` is set when the row had already finished (then nothing is generated for
    it). A continued row draws token ``k = len(token_ids)`` next, with the same counter-RNG draw an uninterrupted
    row makes there (the draws depend only on seed, sample index and position).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    token_versions: tuple[int, ...]
    finish_reason: FinishReason | None = None

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.logprobs) == len(self.token_versions):
            raise ValueError(
                f"RowPrefix has {len(self.token_ids)} token ids, {len(self.logprobs)} logprobs and "
                f"{len(self.token_versions)} versions; each token needs one of each"
            )


@dataclass(frozen=True)
class GenerationRequest:
    """Ask for ``num_samples`` completions of one tokenized prompt.

    ``seed`` fixes the randomness of this request independently of the batch it is scheduled in;
    callers derive it from (run seed, prompt uid, attempt) with :func:`groupwise.seeding.request_seed`.
    ``prefixes`` (empty, or one entry per sample: a :class:`RowPrefix` or None) continues samples that were
    already partly generated (a resumed in-flight attempt); a None entry samples that row from its start.
    ``max_new_tokens`` lowers the sampling's token limit for this request's rows (an episode turn gets what its
    episode has room for); None keeps the sampling's.
    """

    prompt_token_ids: tuple[int, ...]
    num_samples: int
    seed: int
    prefixes: tuple[RowPrefix | None, ...] = ()
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class Branch:
    """A further training sequence of one sample: a harness session that branched (a retry, an edited history, a
    sub-agent) trains each of its sequences as a row of its own, with the sample's reward and advantage. Its fields
    mean what a :class:`Completion`'s do: the tokens after the group's prompt, each sampled token ``trainable``
    (and trained in this row only), the rest context."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    token_versions: tuple[int, ...]
    trainable: tuple[bool, ...]
    text: str
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.logprobs) == len(self.token_versions) == len(self.trainable):
            raise ValueError(
                f"Branch has {len(self.token_ids)} token ids, {len(self.logprobs)} logprobs, "
                f"{len(self.token_versions)} versions and {len(self.trainable)} trainable flags; one of each per token"
            )


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    ``token_ids`` run through the first EOS (included when the finish reason is ``stop`` because of
    EOS) and nothing after it, so the completion mask is positional: every listed token is real.
    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` recorded at sampling time, under the
    sampling temperature, under the weights that produced it. ``token_versions[i]`` is the weight version that
    produced ``token_ids[i]``; ``weight_version`` is the version of the last token. Without partial rollouts every
    token of a completion comes from one version (``token_versions`` may then be left out: every token gets
    ``weight_version``); with them a completion can span weight syncs.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: FinishReason
    weight_version: int
    token_versions: tuple[int, ...] = ()  # () = every token of weight_version (filled in below)
    # An episode's completion interleaves sampled tokens with the environment's (observations, template
    # turn markers); trainable[i] says token i was sampled by the model. () = every token was (single turn).
    trainable: tuple[bool, ...] = ()
    episode: EpisodeRecord | None = None
    branches: tuple[Branch, ...] = ()  # a harness session's further sequences, each trained as a row of its own

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Completion has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs; "
                "every token needs the logprob recorded when it was sampled"
            )
        if not self.token_versions and self.token_ids:
            object.__setattr__(self, "token_versions", (self.weight_version,) * len(self.token_ids))
        elif len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"Completion has {len(self.token_ids)} token ids but {len(self.token_versions)} token versions; "
                "every token needs the weight version that produced it"
            )
        if self.trainable and len(self.trainable) != len(self.token_ids):
            raise ValueError(
                f"Completion has {len(self.token_ids)} token ids but {len(self.trainable)} trainable flags"
            )

    @property
    def num_tokens(self) -> int:
        """Tokens the model sampled (an episode's environment tokens are not counted), its branches' included."""
        own = sum(self.trainable) if self.trainable else len(self.token_ids)
        return own + sum(sum(branch.trainable) for branch in self.branches)


@dataclass(frozen=True)
class GenerationCost:
    """What the generator spent on one attempt: its completion tokens and the generation seconds attributed to it.

    ``seconds`` is a share of a generator call's wall time, pro rata by completion tokens among the groups of the
    call (:func:`groupwise.algo.waste.split_call_seconds`; docs/metrics.md, "Wasted compute", says how each runtime
    and the simulator attribute it).
    """

    tokens: int = 0
    seconds: float = 0.0


NO_COST = GenerationCost()


Failure = TypeVar("Failure", bound=BaseException)


def attach_cost(error: Failure, cost: GenerationCost) -> Failure:
    """Record on ``error`` what the failed (or cancelled) attempt had cost; returns ``error``."""
    error.generation_cost = cost  # type: ignore[attr-defined]
    return error


def cost_of(error: BaseException) -> GenerationCost:
    """What :func:`attach_cost` recorded on ``error`` (nothing recorded: :data:`NO_COST`)."""
    cost = getattr(error, "generation_cost", None)
    return cost if isinstance(cost, GenerationCost) else NO_COST


Outcome = TypeVar("Outcome", bound="Group | BaseException")


def charge_seconds(outcome: Outcome, seconds: float) -> Outcome:
    """``outcome`` of one attempt charged ``seconds`` of generation: a group's ``gen_seconds``, or on an error (a
    reward failure) its recorded cost, keeping the tokens already recorded there. Returns ``outcome``."""
    if isinstance(outcome, Group):
        outcome.gen_seconds = seconds
        return outcome
    return attach_cost(outcome, GenerationCost(cost_of(outcome).tokens, seconds))


@dataclass
class Group:
    """One prompt with its G scored completions.

    ``raw_rewards`` come straight from the reward function and are what the zero-variance filter
    sees; ``rewards`` are after scaling and overlong shaping and are what advantages use. The two
    lists are never overwritten by anything else (an advantage lives in its own column).
    ``start_version``/``end_version`` are the generator's weight versions at dispatch and finish.
    ``target_step`` is the step an ``in_order`` sampler stamped on the slot (else None). ``gen_seconds`` is the
    generation time attributed to the group (see :class:`GenerationCost`).
    """

    group_id: int
    prompt: Prompt
    prompt_token_ids: tuple[int, ...]
    completions: list[Completion]
    raw_rewards: list[float]
    rewards: list[float]
    start_version: int = 0
    end_version: int = 0
    epoch: int = 0
    attempt: int = 0
    target_step: int | None = None
    gen_seconds: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.completions)
        if len(self.raw_rewards) != n or len(self.rewards) != n:
            raise ValueError(
                f"group {self.group_id}: {n} completions but {len(self.raw_rewards)} raw rewards and "
                f"{len(self.rewards)} rewards; each completion needs exactly one of each"
            )

    @property
    def size(self) -> int:
        return len(self.completions)

    @property
    def num_completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.completions)

    @property
    def cost(self) -> GenerationCost:
        """The group's generation cost: its completion tokens and :attr:`gen_seconds`."""
        return GenerationCost(self.num_completion_tokens, self.gen_seconds)


def group_to_dict(group: Group) -> dict[str, Any]:
    """A JSON-serialisable copy of a group (for checkpoints of buffered or carried groups)."""
    return {
        "group_id": group.group_id,
        "prompt": {
            "uid": group.prompt.uid,
            "answer": group.prompt.answer,
            "text": group.prompt.text,
            "messages": [dict(m) for m in group.prompt.messages] if group.prompt.messages is not None else None,
            "metadata": dict(group.prompt.metadata),
        },
        "prompt_token_ids": list(group.prompt_token_ids),
        "completions": [
            {
                "token_ids": list(c.token_ids),
                "logprobs": list(c.logprobs),
                "text": c.text,
                "finish_reason": c.finish_reason,
                "weight_version": c.weight_version,
                **({} if _uninterrupted(c) else {"token_versions": list(c.token_versions)}),
                **({"trainable": [int(t) for t in c.trainable]} if c.trainable else {}),
                **({"episode": c.episode.to_dict()} if c.episode is not None else {}),
                **({"branches": [_branch_to_dict(b) for b in c.branches]} if c.branches else {}),
            }
            for c in group.completions
        ],
        "raw_rewards": list(group.raw_rewards),
        "rewards": list(group.rewards),
        "start_version": group.start_version,
        "end_version": group.end_version,
        "epoch": group.epoch,
        "attempt": group.attempt,
        "target_step": group.target_step,
        "gen_seconds": group.gen_seconds,
    }


def _branch_to_dict(branch: Branch) -> dict[str, Any]:
    return {"token_ids": list(branch.token_ids), "logprobs": list(branch.logprobs),
            "token_versions": list(branch.token_versions), "trainable": [int(t) for t in branch.trainable],
            "text": branch.text, "finish_reason": branch.finish_reason}  # fmt: skip


def _branch_from_dict(data: dict[str, Any]) -> Branch:
    return Branch(tuple(data["token_ids"]), tuple(data["logprobs"]), tuple(data["token_versions"]),
                  tuple(bool(t) for t in data["trainable"]), data["text"], data["finish_reason"])  # fmt: skip


def _uninterrupted(completion: Completion) -> bool:
    return all(v == completion.weight_version for v in completion.token_versions)


def group_from_dict(data: dict[str, Any]) -> Group:
    """Inverse of :func:`group_to_dict`."""
    p = data["prompt"]
    prompt = Prompt(
        uid=p["uid"],
        answer=p["answer"],
        text=p["text"],
        messages=tuple(dict(m) for m in p["messages"]) if p["messages"] is not None else None,
        metadata=dict(p["metadata"]),
    )
    completions = [
        Completion(
            token_ids=tuple(c["token_ids"]),
            logprobs=tuple(c["logprobs"]),
            text=c["text"],
            finish_reason=c["finish_reason"],
            weight_version=c["weight_version"],
            token_versions=tuple(c["token_versions"]) if "token_versions" in c else (),
            trainable=tuple(bool(t) for t in c.get("trainable", ())),
            episode=EpisodeRecord.from_dict(c["episode"]) if "episode" in c else None,
            branches=tuple(_branch_from_dict(b) for b in c.get("branches", ())),
        )
        for c in data["completions"]
    ]
    return Group(
        group_id=data["group_id"],
        prompt=prompt,
        prompt_token_ids=tuple(data["prompt_token_ids"]),
        completions=completions,
        raw_rewards=list(data["raw_rewards"]),
        rewards=list(data["rewards"]),
        start_version=data["start_version"],
        end_version=data["end_version"],
        epoch=data["epoch"],
        attempt=data["attempt"],
        target_step=data["target_step"],
        gen_seconds=float(data.get("gen_seconds", 0.0)),  # absent in checkpoints written before it was recorded
    )
