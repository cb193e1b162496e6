"""`custom`: a user sampler loaded from ``target: "module:ClassName"``.

The class is instantiated with ``(buffer, **kwargs)`` and must satisfy the :class:`Sampler` protocol
(member presence, as a runtime-checkable protocol checks). It may also implement
:class:`DropAccountingSampler`; otherwise the controller applies the gated defaults.
"""

from __future__ import annotations

import importlib
from typing import Any

from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.samplers.base import Sampler


def load_custom_sampler(target: str, buffer: GroupBuffer, kwargs: dict[str, Any] | None = None) -> Sampler:
    """Import ``module:ClassName``, build it with ``(buffer, **kwargs)`` and check the protocol."""
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(f"custom sampler target must look like 'package.module:ClassName', got {target!r}")
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"custom sampler target {target!r}: cannot import module {module_name!r} ({exc})") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"custom sampler target {target!r}: module {module_name!r} has no {class_name!r}")
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
