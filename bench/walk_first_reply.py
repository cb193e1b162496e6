"""Where does a policy's first move go? Greedy first replies to the held-out number walks, per saved policy.

    .venv/bin/python bench/walk_first_reply.py POLICY_DIR [POLICY_DIR ...]
    .venv/bin/python bench/walk_first_reply.py --guided POLICY_DIR ...   # the guided walk (nearer move offered first)

Each ``POLICY_DIR`` is a folder ``transformers`` loads (a run's ``final/``, or the float32 SmolLM2 folder that
``groupwise train`` caches under ``~/.cache/groupwise/gguf/``). For every prompt of
``examples/data/number_walk/eval.jsonl`` the policy answers once, greedily, with ``generation.max_new_tokens`` = 8
as in ``examples/number_walk.yaml``, to two wordings of the same position: the shipped opening prompt, and the
environment's own follow-up question (``position_message``). The reply is read as ``number_walk`` reads it
(``next_move``). Counted: replies that moved, and moves toward the goal. A walk's first reply that moves nothing
costs the walk a move, so no walk can be won in the fewest moves; a first move chosen without reading the goal goes
toward it half the time. With ``--guided`` the walks are ``examples/data/number_walk_guided/eval.jsonl`` (6 moves)
and the follow-up question offers the move toward the goal first, as ``number_walk`` with ``nearer_first`` does.
Prints one markdown row per policy and wording, with three replies as examples.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from groupwise.environments.number_walk import next_move, position_message

DATA = Path(__file__).resolve().parent.parent / "examples" / "data"
MAX_NEW_TOKENS = 8


def greedy_reply(model, tokenizer, text: str) -> str:
    """The policy's greedy reply to one user message, rendered by its chat template."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy_dirs", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--guided", action="store_true", help="the guided walk: the nearer move offered first")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder, moves = ("number_walk_guided", 6) if args.guided else ("number_walk", 10)
    walks = [json.loads(line) for line in (DATA / folder / "eval.jsonl").read_text().splitlines() if line.strip()]
    wordings = {"opening prompt": lambda w: w["messages"][0]["content"],
                "follow-up question": lambda w: position_message(int(w["start"]), int(w["answer"]), moves, args.guided)}
    print("| policy | wording | first replies that moved | toward the goal | replies, e.g. |")
    print("|---|---|---:|---:|---|")
    for policy in args.policy_dirs:
        tokenizer = AutoTokenizer.from_pretrained(policy)
        model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
        for name, wording in wordings.items():
            moved = toward = 0
            replies = []
            for walk in walks:
                start, goal = int(walk["start"]), int(walk["answer"])
                reply = greedy_reply(model, tokenizer, wording(walk))
                move = next_move(reply, start)
                moved += move != 0
                toward += move != 0 and abs(goal - start - move) < abs(goal - start)
                replies.append(reply)
            examples = "; ".join(f"`{r.strip()}`" for r in replies[:3])
            print(f"| {policy} | {name} | {moved}/{len(walks)} | {toward}/{len(walks)} | {examples} |")


if __name__ == "__main__":
    main()
