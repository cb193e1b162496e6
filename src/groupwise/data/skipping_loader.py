"""A prompt loader that skips draws predicted to carry no signal (``data.skip_no_signal``), before dispatch.

:class:`NoSignalSkippingLoader` is a :class:`~groupwise.data.loader.PromptLoader` whose fresh stream draws pass
:meth:`SignalHistory.decide` first (:mod:`groupwise.data.signal_history`): a skipped draw is consumed for its epoch
and :meth:`take` keeps drawing, so a caller still gets ``n`` prompts while the data lasts and never sees the skip
— step sizes, the samplers' batches and the ledger are those of a run without skipping. Prompts put back with
``push_front`` (in flight at a checkpoint, or sent back from the sampler's gate) were decided already: they are
never skipped.

The loops feed it each generated group (:meth:`observe`) and write a ``skipped_no_signal`` fate for every skipped
draw (:meth:`drain_skipped`); they find both through the ``SkipsNoSignal`` capability
(``groupwise.controller.interfaces``), so a plain loader costs nothing. Its checkpoint state is the loader's plus
the history, under ``skip_no_signal``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from groupwise.algo.filter import GroupFilter
from groupwise.data.loader import LoadedPrompt, PromptLoader
from groupwise.data.signal_history import SignalHistory, SkippedDraw, SkipSettings
from groupwise.types import Group, Prompt

if TYPE_CHECKING:
    from groupwise.config import RunConfig

STATE_KEY = "skip_no_signal"


class NoSignalSkippingLoader(PromptLoader):
    """A :class:`PromptLoader` that skips prompts whose recent groups all had zero variance (module docstring)."""

    def __init__(
        self,
        prompts: Sequence[Prompt],
        seed: int,
        settings: SkipSettings,
        group_filter: GroupFilter,
        shuffle: bool = True,
        max_epochs: int | None = None,
    ) -> None:
        super().__init__(prompts, seed, shuffle=shuffle, max_epochs=max_epochs)
        self.history = SignalHistory(settings, group_filter, seed)
        self._skipped: list[SkippedDraw] = []  # decided, fate not yet written
        self._reported = (0, 0)  # (skipped, tokens saved) at the last step's metrics

    def _admits(self, item: LoadedPrompt) -> bool:
        skip = self.history.decide(item.prompt.uid, item.epoch)
        if skip is None:
            return True
        self._skipped.append(skip)
        return False

    def observe(self, group: Group) -> None:
        """Record a generated group's outcome in its prompt's history."""
        self.history.observe(group.prompt.uid, group.raw_rewards, group.num_completion_tokens)

    def drain_skipped(self) -> list[SkippedDraw]:
        """The draws skipped since the last call, in draw order (the caller writes their fates)."""
        skipped, self._skipped = self._skipped, []
        return skipped

    def step_metrics(self) -> dict[str, float]:
        """The ``skip/*`` metrics (docs/metrics.md): draws skipped and tokens saved since the previous step, the
        run's totals, and the outcomes of prompts generated again after a skip."""
        history = self.history
        skipped, saved = self._reported
        self._reported = (history.skipped, history.tokens_saved)
        retried = history.retry_outcomes
        total_retried = sum(retried.values())
        return {
            "skip/prompts": float(history.skipped - skipped),
            "skip/cumulative_prompts": float(history.skipped),
            "skip/tokens_saved_est": float(history.tokens_saved - saved),
            "skip/cumulative_tokens_saved_est": float(history.tokens_saved),
            "skip/retried": float(total_retried),
            "skip/retried_mixed_fraction": retried.get("mixed", 0) / total_retried if total_retried else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        if self._skipped:  # a checkpoint between a take() and its fates would lose those lines
            raise AssertionError(f"{len(self._skipped)} skipped draw(s) have no fate line yet at a checkpoint")
        return {**super().state_dict(), STATE_KEY: self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor and the history; a checkpoint written without skipping starts an empty history."""
        super().load_state_dict(state)
        if STATE_KEY in state:
            self.history.load_state_dict(state[STATE_KEY])
        self._skipped = []
        self._reported = (self.history.skipped, self.history.tokens_saved)


def build_training_loader(cfg: RunConfig, prompts: Sequence[Prompt]) -> PromptLoader:
    """The run's training loader: a :class:`NoSignalSkippingLoader` when ``data.skip_no_signal.enabled``, else a
    plain :class:`PromptLoader` (the same stream, nothing skipped)."""
    skip = cfg.data.skip_no_signal
    if not skip.enabled:
        return PromptLoader(prompts, seed=cfg.run.seed, shuffle=cfg.data.shuffle, max_epochs=cfg.run.max_epochs)
    settings = SkipSettings(skip.history, skip.base_retry, skip.growth, frozenset(skip.kinds))
    return NoSignalSkippingLoader(
        prompts, cfg.run.seed, settings, cfg.grpo.group_filter(), shuffle=cfg.data.shuffle,
        max_epochs=cfg.run.max_epochs,
    )  # fmt: skip
