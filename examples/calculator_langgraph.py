"""The calculator task as a LangGraph ReAct agent (``pip install 'groupwise[agents]'``): the framework's own loop,
pointed at the policy being trained.

``episode.harness: examples/calculator_langgraph.py:run``. The model is LangChain's ``ChatOpenAI`` on the session's
``base_url`` with the calculator's tool schemas bound (the same ones ``examples/calculator_harness.py`` sends);
LangGraph runs the tools and loops until the model answers without a call. Returning ``None`` lets
``reward.function`` (``final_number``) score the last reply.
"""

import contextlib

from calculator_harness import SCHEMAS, SYSTEM  # its neighbour: the same system prompt and tool schemas
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from groupwise.harness import HarnessSession


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return int(a) * int(b)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return int(a) + int(b)


def run(session: HarnessSession, max_turns: int = 3) -> None:
    model = ChatOpenAI(base_url=session.base_url, api_key=session.api_key, model=session.model, max_retries=0)
    agent = create_react_agent(model.bind_tools(SCHEMAS), [multiply, add], prompt=SYSTEM)
    with contextlib.suppress(GraphRecursionError):  # out of turns: the last reply is scored as it is
        agent.invoke({"messages": session.messages}, {"recursion_limit": 2 * max_turns})  # a call, a tool round: 2
    return None
