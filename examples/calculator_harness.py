"""The calculator task as an agent you might already have: a plain OpenAI-SDK loop with tools.

groupwise calls ``run`` once per sample (``episode.harness: examples/calculator_harness.py:run``) with a session
whose ``base_url`` and ``api_key`` point this client at the policy being trained; every request is recorded and
trains. Returning ``None`` lets ``reward.function`` (``final_number``) score the last reply.
"""

import json

from openai import OpenAI
from transformers.utils import get_json_schema

from groupwise.harness import HarnessSession

SYSTEM = "Use the tools for arithmetic. Give the final answer as a number."


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return int(a) * int(b)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    return int(a) + int(b)


TOOLS = {tool.__name__: tool for tool in (multiply, add)}


def run(session: HarnessSession, max_turns: int = 3) -> None:
    client = OpenAI(base_url=session.base_url, api_key=session.api_key)
    messages = [{"role": "system", "content": SYSTEM}, *session.messages]
    for _ in range(max_turns):
        reply = client.chat.completions.create(
            model=session.model, messages=messages, tools=[get_json_schema(t) for t in TOOLS.values()]
        ).choices[0].message
        if not reply.tool_calls:
            return None  # the final answer: reward.function scores it
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            try:
                answer = str(TOOLS[call.function.name](**json.loads(call.function.arguments)))
            except Exception as exc:  # the model's bad call is an answer it reads
                answer = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
    return None
