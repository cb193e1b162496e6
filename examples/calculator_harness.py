"""The calculator task as an agent you might already have: a plain OpenAI-SDK loop with tools.

groupwise calls ``run`` once per sample (``episode.harness: examples/calculator_harness.py:run``) with a session
whose ``base_url`` and ``api_key`` point this client at the policy being trained; every request is recorded and
trains. Returning ``None`` lets ``reward.function`` (``final_number``) score the last reply.
"""

import json

from openai import OpenAI

from groupwise.harness import HarnessSession

SYSTEM = "Use the tools for arithmetic. Give the final answer as a number."
TOOLS = {"multiply": lambda a, b: int(a) * int(b), "add": lambda a, b: int(a) + int(b)}


def schema(name: str, description: str, term: str) -> dict:
    numbers = {
        "a": {"type": "integer", "description": f"The first {term}."},
        "b": {"type": "integer", "description": f"The second {term}."},
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": numbers, "required": ["a", "b"]},
        },
    }


SCHEMAS = [schema("multiply", "Multiply two integers.", "factor"), schema("add", "Add two integers.", "term")]


def run(session: HarnessSession, max_turns: int = 3) -> None:
    client = OpenAI(base_url=session.base_url, api_key=session.api_key)
    messages = [{"role": "system", "content": SYSTEM}, *session.messages]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=session.model, messages=messages, tools=SCHEMAS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return None  # the final answer: reward.function scores it
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                answer = str(TOOLS[call.function.name](**json.loads(call.function.arguments)))
            except Exception as exc:  # a bad call is an answer the model reads
                answer = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
    return None
