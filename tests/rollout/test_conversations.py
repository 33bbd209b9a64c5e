"""Which rows a rollout's calls become (rollout/conversation.py, runner.trajectory_of): the
earlier call a call continues, the call a returned reply is, the conversation that is final;
and what a trajectory reports of its turns (agent_api.Trajectory)."""

import asyncio
import types

import numpy as np
import pytest

from memagent_jax.data.needle import QUESTION, needle_rows, write_tokenizer
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import (
    AssistantMessage,
    Conversation,
    Rollout,
    Trajectory,
    Turn,
)
from memagent_jax.rollout.chat import chat_ids
from memagent_jax.rollout.runner import AgentRunner, trajectory_of
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import EOS, ReplyEngine

ASKED = [{"role": "user", "content": QUESTION}]
# A reply's words by the number of user messages in its prompt: each call of a conversation
# gets another reply.
WORDS = ["the river", "an old mill", "a stone bridge", "bright lamps", "tall green trees"]


def _user(text):
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(write_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def _run(tokenizer, rollout):
    """The one trajectory of `rollout` on the first needle row, replies by WORDS."""
    def reply(prompt):
        words = WORDS[prompt.count("user") - 1]
        return tokenizer(words, add_special_tokens=False)["input_ids"] + [EOS]

    runner = AgentRunner(Scheduler(ReplyEngine(tokenizer, reply)), tokenizer, (EOS,))
    row = example_from_row(needle_rows(1, seed=3)[0], 0)
    ((trajectory,),) = runner.run(types.SimpleNamespace(rollout=rollout, name="test"),
                                  [row], SamplingParams(0.0))
    return trajectory


def _replies(turn):
    return [m.reply for m in turn.messages if isinstance(m, AssistantMessage)]


async def _forking(row, policy):
    """Three calls, each continuing the last, then a fourth that forks from the first."""
    a = await policy.chat(ASKED, max_tokens=4)
    b = await policy.chat(ASKED + [a.message, _user("the river")], max_tokens=4)
    c = await policy.chat(ASKED + [a.message, _user("the river"), b.message,
                                   _user("the mill")], max_tokens=4)
    d = await policy.chat(ASKED + [a.message, _user("the market")], max_tokens=4)
    return [ASKED + [a.message, _user("the river"), b.message, _user("the mill"), c.message],
            ASKED + [a.message, _user("the market"), d.message]]


def test_a_call_continues_the_latest_call_its_messages_extend(tokenizer):
    """The third call extends both earlier calls' messages: it continues the second (the
    latest), so its conversation is one row of three replies; the fork continues the first
    call only. Each row is its last call's prompt and reply, every generated id trained."""
    trajectory = _run(tokenizer, _forking)
    assert [len(t.replies()) for t in trajectory.turns] == [3, 2]  # a row per conversation
    chain, fork = trajectory.turns
    a, b, c = _replies(chain)
    assert _replies(fork)[0] is a
    d = _replies(fork)[1]
    assert c.prompt_ids[:len(b.prompt_ids) + len(b.token_ids)] == b.prompt_ids + b.token_ids
    assert d.prompt_ids[:len(a.prompt_ids) + len(a.token_ids)] == a.prompt_ids + a.token_ids
    for turn, replies in ((chain, (a, b, c)), (fork, (a, d))):
        assert turn.prompt_ids == a.prompt_ids == chat_ids(tokenizer, ASKED)
        assert turn.prompt_ids + turn.response_ids == replies[-1].prompt_ids + \
            replies[-1].token_ids
        assert [t for t, m in zip(turn.response_ids, turn.response_mask) if m] == \
            [t for r in replies for t in r.token_ids]
        assert turn.replies() == [(len(r.token_ids), 4) for r in replies]


def test_a_reply_under_other_earlier_messages_starts_a_prompt_of_its_own(tokenizer):
    """The second call sends the first call's reply after another question: it does not
    continue the first call (whose prompt asked something else); its prompt is its own
    messages through the template."""
    seen = []

    async def rephrased(row, policy):
        a = await policy.chat(ASKED, max_tokens=4)
        other = [_user("where is the mill ?"), a.message, _user("the river")]
        b = await policy.chat(other, max_tokens=4)
        seen.append((other, b))
        return [other + [b.message]]

    trajectory = _run(tokenizer, rephrased)
    ((other, b),) = seen
    assert b.prompt_ids == chat_ids(tokenizer, other)
    assert trajectory.turns[-1].prompt_ids + trajectory.turns[-1].response_ids == \
        b.prompt_ids + b.token_ids


def test_a_plain_dict_reply_is_the_call_that_answered_its_messages(tokenizer):
    """Two calls reply the same text to different questions; the agent returns each reply as
    a plain dict: each is matched to the call its conversation asked, not to the first call
    with that text."""
    questions = [[_user("the river")], [_user("the mill")]]

    async def plain(row, policy):
        replies = await asyncio.gather(*(policy.chat(q, max_tokens=4) for q in questions))
        assert replies[0].text == replies[1].text
        return [q + [{"role": "assistant", "content": r.text}]
                for q, r in zip(questions, replies)]

    trajectory = _run(tokenizer, plain)
    assert [t.prompt_ids for t in trajectory.turns] == [chat_ids(tokenizer, q)
                                                        for q in questions]


def test_a_bare_list_of_conversations_answers_from_the_last(tokenizer):
    async def two(row, policy):
        first = await policy.chat([_user("the river")], max_tokens=4)
        second = await policy.chat([_user("the mill")], max_tokens=4)
        return [[first.message], [second.message]]

    trajectory = _run(tokenizer, two)
    assert [t.kind for t in trajectory.turns] == ["turn", "final"]
    rows = rows_from_trajectories([trajectory], [1.0])
    np.testing.assert_array_equal(rows.final, [False, True])


def _turn(kind, reply, messages=None):
    return Turn(kind, [1, 5], [6, 7, EOS], [-0.5, -0.25, -0.125], "stop", reply,
                messages=messages)


def test_without_a_final_turn_the_answer_is_the_last_turns():
    """A trajectory none of whose turns is labelled final (MemAgent's updates, shown before
    the final turn is taken) answers from its last turn, in its record too."""
    trajectory = Trajectory("q", [_turn("update", "first"), _turn("update", "second")])
    assert trajectory.final_turn is trajectory.turns[-1]
    assert trajectory.final_reply == "second"
    assert trajectory.record()["final_reply"] == "second"


def test_a_record_holds_a_conversations_messages_where_there_is_more_than_the_reply():
    """MemAgent's turns are one reply each: their records carry no messages; a conversation
    that asked something carries its messages."""
    asked = [_user("the river"), AssistantMessage("an old mill")]
    trajectory = Trajectory("q", [_turn("update", "mill", [AssistantMessage("mill")]),
                                  _turn("final", "an old mill", asked)])
    one, more = trajectory.record()["turns"]
    assert "messages" not in one
    assert more["messages"] == [_user("the river"),
                                {"role": "assistant", "content": "an old mill"}]


async def _noting(row, policy):
    """Two conversations with notes: the first's on the conversation, the rollout's own."""
    first = await policy.chat([_user("the river")], max_tokens=4)
    second = await policy.chat([_user("the mill")], max_tokens=4)
    return Rollout([Conversation([first.message], info={"seen": "river"}), [second.message]],
                   info={"asked": 2})


def test_an_agents_notes_reach_its_turns_and_record_and_no_other_keys(tokenizer):
    """`Conversation.info` becomes its turn's `info` and keys of that turn's record,
    `Rollout.info` the trajectory's and keys of the record, after the answer; a conversation
    without notes, and a trajectory without them, have no keys of theirs (no "memory")."""
    trajectory = _run(tokenizer, _noting)
    assert [t.info for t in trajectory.turns] == [{"seen": "river"}, {}]
    record = trajectory.record()
    assert list(record)[:4] == ["problem", "answer", "asked", "final_reply"]
    assert record["asked"] == 2 and record["turns"][0]["seen"] == "river"
    assert list(record["turns"][1]) == ["kind", "reply", "finish_reason", "response_tokens"]


@pytest.mark.parametrize("rollout, message", [
    (Rollout([[_user("q")]], info={"answer": "x"}), "Rollout.info names 'answer'"),
    (Rollout([Conversation([_user("q")], info={"kind": "x"})]), "conversation 0's info names "
                                                                 "'kind'"),
    (Rollout([[_user("q")]], info=["x"]), "Rollout.info must be a dict"),
])
def test_notes_that_would_overwrite_the_records_own_keys_are_refused(rollout, message):
    with pytest.raises(TypeError, match=message):
        trajectory_of(rollout, {}, types.SimpleNamespace(question="q"))
