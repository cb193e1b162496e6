"""A harness session's tree: what trains is exactly what was served, and an edited history is never spliced.

Invariants pinned:
- a request that extends the last one (its messages, the reply served to it, new messages) continues the same
  sequence: its context is the recorded sampled ids (never their text re-encoded: ids whose text would re-encode
  otherwise are kept) followed by the new messages as the template renders them; the sequence's text is the
  template's rendering of the whole conversation;
- every served token trains exactly once over all of a session's sequences, and no context token trains;
- a request whose history was edited (a changed earlier message, a dropped turn, a compacted context) starts a new
  sequence rendered whole: the earlier sequence is unchanged and the new one holds none of its sampled tokens as
  trainable; the edited assistant turn's tokens count as retokenized;
- a repeated request (a retry, a second sample) and a request that branches from an earlier reply start a new
  sequence sharing the recorded prefix, as context;
- a template that rewrites earlier turns (drops earlier reasoning) gives one sequence per request, each trained on
  exactly the context its request was sampled from;
- token-in requests extend the sequence their ids extend; an abandoned request leaves nothing behind;
- new messages past ``max_new_tokens`` are cut to fit and marked (a 50,000-character answer keeps its start), and
  the harness's next request, echoing the whole message, still continues the same sequence; a cap the template's
  framing alone exceeds is refused; such a session replays to the same sequences under the same cap (and not
  without it);
- a branched session trains one row per sequence, each with the sample's reward and advantage, its record on the
  first row only; the group's prompt is what every row shares before sampling; branches survive a checkpoint.
"""

from __future__ import annotations

import pytest
from test_episodes import DROPS_EARLIER_REASONING, EOS, TOKENIZER, chars

from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE
from groupwise.episodes.tool_formats import TOOL_FORMATS
from groupwise.harness.live import LiveSession, SessionLimits
from groupwise.harness.render import RequestRenderer, served_key
from groupwise.harness.tree import NewContextTooLong, SessionTree
from groupwise.harness.wire import ChatMessage
from groupwise.types import Completion, Prompt


def tree(template: str = PLAIN_CHAT_TEMPLATE) -> SessionTree:
    return SessionTree(RequestRenderer(TOKENIZER, template, TOOL_FORMATS["hermes"]))


def served(ids: list[int], version: int = 0) -> Completion:
    text = TOKENIZER.decode([i for i in ids if i != EOS], skip_special_tokens=False)
    return Completion(tuple(ids), tuple(-0.5 for _ in ids), text, "stop" if ids[-1] == EOS else "length", version)


def serve(session: SessionTree, messages: list[ChatMessage], ids: list[int]) -> tuple[Completion, ChatMessage]:
    """Place a request, record ``ids`` as its one choice; the assistant message a harness would echo back."""
    placement = session.place(messages, (), version=0)
    completion = served(ids)
    session.record(placement, [completion], [served_key(completion.text, ())])
    return completion, ChatMessage("assistant", completion.text)


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def sampled(row) -> list[int]:
    return [t for t, keep in zip(row.token_ids, row.trainable, strict=True) if keep]


def test_a_linear_session_is_one_sequence_of_the_ids_served_and_the_templates_rendering():
    odd = chars("<eos>7") + [EOS]  # its text re-encodes to other ids: only the recorded ids may train
    assert TOKENIZER(TOKENIZER.decode(odd), add_special_tokens=False)["input_ids"] != odd
    session = tree()
    history = [ChatMessage("system", "Be brief."), user("2+2?")]
    opening = session.renderer.opening([{"role": m.role, "content": m.content} for m in history], ())
    _, reply1 = serve(session, history, odd)
    assert session.sequences[0].token_ids == opening + odd
    history += [reply1, user("Sure?")]
    placement = session.place(history, (), version=0)
    assert placement.kind == "extend" and placement.sequence == 0
    assert list(placement.context[: len(opening) + len(odd)]) == opening + odd  # the served ids, as served
    new = TOKENIZER.decode(list(placement.context[len(opening) + len(odd) :]), skip_special_tokens=False)
    assert new == "\nuser: Sure?\nassistant: " and placement.env_tokens == len(new)
    session.record(placement, [served(chars("4") + [EOS])], [served_key("4", ())])
    (row,) = session.rows()
    assert sampled(row) == odd + chars("4") + [EOS]
    # The whole sequence reads as the template's rendering of the conversation (with the reply's own text).
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": reply1.content},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "4"},
    ]
    rendered = TOKENIZER.apply_chat_template(conversation, chat_template=PLAIN_CHAT_TEMPLATE, tokenize=False)
    assert TOKENIZER.decode(row.token_ids, skip_special_tokens=False) == rendered.rstrip("\n")
    assert placement.retokenized_tokens == 0


def test_an_edited_history_starts_a_new_sequence_rendered_whole_never_a_splice():
    session = tree()
    _, reply1 = serve(session, [user("2+2?")], chars("five") + [EOS])
    before = list(session.sequences[0].token_ids)
    edited = ChatMessage("assistant", "4")  # the harness rewrote the model's answer
    placement = session.place([user("2+2?"), edited, user("Sure?")], (), version=0)
    assert placement.kind == "root" and placement.sequence == 1
    assert placement.retokenized_tokens == len(chars("4"))
    session.record(placement, [served(chars("yes") + [EOS])], [served_key("yes", ())])
    first, second = session.rows()
    assert first.token_ids == before  # untouched
    assert sampled(first) == chars("five") + [EOS] and sampled(second) == chars("yes") + [EOS]
    assert not any(second.trainable[: len(placement.context)])
    assert TOKENIZER.decode(list(placement.context)).startswith("user: 2+2?\nassistant: 4")


def test_a_retry_and_a_branch_share_the_recorded_prefix_as_context_and_each_token_trains_once():
    session = tree()
    question = [user("2+2?")]
    _, reply1 = serve(session, question, chars("4") + [EOS])
    _, reply2 = serve(session, [*question, reply1, user("Sure?")], chars("yes") + [EOS])
    retry = session.place(question, (), version=0)  # the same request again: a second sample
    assert retry.kind == "retry" and retry.sequence == 1
    session.record(retry, [served(chars("5") + [EOS])], [served_key("5", ())])
    branch = session.place([*question, reply1, user("Really?")], (), version=0)  # from reply 1, not its follow-up
    assert branch.kind == "extend" and branch.sequence == 2
    session.record(branch, [served(chars("no") + [EOS])], [served_key("no", ())])
    main, retried, branched = session.rows()
    assert sampled(main) == chars("4") + [EOS] + chars("yes") + [EOS]
    assert sampled(retried) == chars("5") + [EOS]
    assert sampled(branched) == chars("no") + [EOS]  # reply 1's ids are context here: they trained in main
    reply1_end = len(session.renderer.opening([{"role": "user", "content": "2+2?"}], ())) + 2
    assert branched.token_ids[:reply1_end] == main.token_ids[:reply1_end] and not any(branched.trainable[:reply1_end])
    assert retried.token_ids[: reply1_end - 2] == main.token_ids[: reply1_end - 2]
    served_total = sum(len(s) for s in (chars("4"), chars("yes"), chars("5"), chars("no"))) + 4
    assert sum(sum(row.trainable) for row in session.rows()) == served_total


def test_a_template_that_rewrites_history_gives_one_sequence_per_request_on_its_exact_context():
    session = tree(DROPS_EARLIER_REASONING)
    first = chars("<think>hmm</think>4") + [EOS]
    _, reply1 = serve(session, [user("2+2?")], first)
    placement = session.place([user("2+2?"), reply1, user("Sure?")], (), version=0)
    assert placement.kind == "root"
    context = TOKENIZER.decode(list(placement.context))
    assert context == "user:2+2?\nassistant:4<eos>\nuser:Sure?\nassistant: "  # what the model was shown
    session.record(placement, [served(chars("yes") + [EOS])], [served_key("yes", ())])
    rows = session.rows()
    assert [sampled(r) for r in rows] == [first, chars("yes") + [EOS]]


def test_token_in_requests_extend_their_sequence_and_an_abandoned_request_leaves_nothing():
    session = tree()
    prompt = chars("1+1=")
    placement = session.place_tokens(prompt, version=0)
    session.record(placement, [served(chars("2") + [EOS])], [None])
    follow = [*prompt, *chars("2"), EOS, *chars("2+2=")]
    placement = session.place_tokens(follow, version=0)
    assert placement.kind == "tokens" and placement.sequence == 0 and placement.env_tokens == len(chars("2+2="))
    session.abandon(placement)
    (row,) = session.rows()
    assert row.token_ids == [*prompt, *chars("2"), EOS] and not row.busy
    edited = session.place([user("hello")], (), version=0)
    session.abandon(edited)
    assert len(session.rows()) == 1 and session.sequences[1].dead


def test_a_branched_session_trains_a_row_per_sequence_with_its_samples_reward_and_survives_a_checkpoint():
    from groupwise.harness.runner import SessionResult
    from groupwise.harness.samples import session_completion, shared_prompt
    from groupwise.rows import build_rows
    from groupwise.types import Group, group_from_dict, group_to_dict

    sessions = []
    for sample, answer in enumerate(("4", "5")):
        live = LiveSession(f"k{sample}", sample, sample, tree().renderer, SessionLimits(4, 200, 8, 64))
        _, reply = serve(live.tree, [user("2+2?")], chars(answer) + [EOS])
        serve(live.tree, [user("2+2?")], chars("6") + [EOS])  # a retry: a second sequence
        sessions.append(SessionResult(sample, live, float(sample), 0.1))
    prompt = shared_prompt(sessions)
    assert TOKENIZER.decode(list(prompt)) == "user: 2+2?\nassistant: "  # shared by all four rows, up to sampling
    completions = [session_completion(r, r.reward or 0.0, len(prompt), TOKENIZER.decode) for r in sessions]
    assert [len(c.branches) for c in completions] == [1, 1]
    assert [c.num_tokens for c in completions] == [4, 4]  # 2 sampled in each sequence, branches counted
    group = Group(0, Prompt("p", "4", text="2+2?"), prompt, completions, [0.0, 1.0], [0.0, 1.0])
    rows = build_rows([group], [(-1.0, 1.0)])
    assert rows["completion_index"] == (0, 0, 1, 1) and rows["sequence_index"] == (0, 1, 0, 1)
    assert rows["raw_reward"] == (0.0, 0.0, 1.0, 1.0) and rows["advantage"].tolist() == [-1.0, -1.0, 1.0, 1.0]
    assert rows["completion_ids"][1] == tuple(chars("6") + [EOS]) and rows["env_spans"][1] == ()
    assert rows["episode"][0] is not None and rows["episode"][1] is None  # the record rides on the first row only
    assert group_from_dict(group_to_dict(group)).completions == completions


def test_new_messages_past_the_cap_are_cut_and_the_full_echo_still_continues_the_sequence():
    session = tree()
    _, reply1 = serve(session, [user("run it")], chars("ok") + [EOS])
    long_answer = ChatMessage("tool", "0123456789" * 5_000)  # 50,000 characters: cut before it is rendered
    history = [user("run it"), reply1, long_answer]
    with pytest.raises(NewContextTooLong):  # the template's framing alone takes more than 20 tokens
        session.place(history, (), version=0, max_new_tokens=20)
    placement = session.place(history, (), version=0, max_new_tokens=60)
    assert placement.kind == "extend" and placement.truncated and placement.env_tokens <= 60 + 1  # + the closing
    shown = TOKENIZER.decode(list(placement.context), skip_special_tokens=False)
    assert shown.endswith("[truncated]\nassistant: ") and "0123456789" in shown  # "…" is <unk> to this tokenizer
    session.record(placement, [served(chars("done") + [EOS])], [served_key("done", ())])
    follow = session.place([*history, ChatMessage("assistant", "done"), user("thanks")], (), 0, max_new_tokens=60)
    assert follow.kind == "extend" and follow.sequence == 0 and not follow.truncated  # the whole echo was recognised
    (row,) = session.rows()
    assert sampled(row) == chars("ok") + [EOS] + chars("done") + [EOS]


def test_a_session_whose_messages_were_cut_replays_to_the_same_sequences_under_the_same_cap():
    from dataclasses import asdict

    from groupwise.harness.replay import replay_log
    from groupwise.harness.wire import read_chat_request

    live = LiveSession("k", 0, 0, tree().renderer, SessionLimits(4, 4000, 8, 60))
    messages = [{"role": "user", "content": "run it"}]
    for answer in ("ok", "done"):
        chat = read_chat_request({"messages": messages})
        prepared = live.prepare_chat(chat, 0)
        completion = served(chars(answer) + [EOS])
        logged = {"messages": [asdict(m) for m in chat.messages], "tools": []}  # as the endpoint logs a request
        [choice] = live.serve(prepared, [completion], chat.sampling, None, logged)
        messages = [*messages, {"role": "assistant", "content": choice.text}, {"role": "tool", "content": "7" * 9000}]
    assert live.counts.truncated_messages == 1
    replayed, problem = replay_log(live.log, live.renderer, max_new_tokens=60)
    assert problem is None and [r.token_ids for r in replayed] == [r.token_ids for r in live.tree.rows()]
    _, uncut = replay_log(live.log, live.renderer)  # without the run's cap the long answer renders whole
    assert uncut is not None and "request 2 was placed as extend in sequence 0" in uncut
