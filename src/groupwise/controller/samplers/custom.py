"""`custom`: a user sampler loaded from ``target: "module:ClassName"``.

The class is instantiated with ``(buffer, **kwargs)`` and must satisfy the :class:`Sampler` protocol
(member presence, as a runtime-checkable protocol checks). It may also implement
:class:`DropAccountingSampler`; otherwise the controller applies the gated defaults.
"""

from __future__ import annotations

import inspect
from typing import Any

from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.samplers.base import Sampler
from groupwise.plugins import import_plugin


def import_sampler_class(target: str) -> type:
    """The class ``module:ClassName`` names; ``ValueError`` saying what is wrong when it cannot be imported."""
    cls = import_plugin(target, "custom sampler target")
    if not isinstance(cls, type):
        raise ValueError(f"custom sampler target {target!r}: it is a {type(cls).__name__}, not a class")
    return cls


def sampler_kwargs_problem(cls: type, kwargs: dict[str, Any]) -> str | None:
    """Why ``cls(buffer, **kwargs)`` cannot be called (the kwargs do not fit its signature), or None."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return None  # no inspectable signature: the call itself will tell
    try:
        signature.bind(None, **kwargs)
    except TypeError as exc:
        accepted = list(signature.parameters)[1:]
        return f"{exc}; {cls.__name__} takes (buffer, {', '.join(accepted) or 'nothing else'})"
    return None


def load_custom_sampler(target: str, buffer: GroupBuffer, kwargs: dict[str, Any] | None = None) -> Sampler:
    """Import ``module:ClassName``, build it with ``(buffer, **kwargs)`` and check the protocol."""
    cls = import_sampler_class(target)
    sampler = cls(buffer, **(kwargs or {}))
    if not isinstance(sampler, Sampler):
        missing = [
            name
            for name in (
                "admit",
                "select",
                "evict",
                "should_abort_inflight",
                "required_buffer_capacity",
                "set_dispatch_index",
            )
            if not callable(getattr(sampler, name, None))
        ]
        raise TypeError(
            f"custom sampler {target!r} does not satisfy the Sampler protocol: missing {missing}; "
            "see groupwise.controller.samplers.base.Sampler"
        )
    return sampler
