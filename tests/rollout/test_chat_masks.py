"""What a tool-calling conversation trains: the ids the engine generated, and nothing else.

The oracle is the original's training template (tests/original_chat_template/, verbatim), whose
`{% generation %}` blocks give the original trainer its loss mask through transformers'
`return_assistant_tokens_mask`. For conversations it renders, our row's tokens are its tokens
and our loss mask is its assistant mask: tool results, user and system tokens carry no loss.
Where the generated ids are not the text's canonical tokenization, the row keeps the generated
ids (the template's re-tokenization would train other ids than were sampled)."""

import os

import numpy as np
import pytest

from memagent_jax.agents.tool_calling import build as build_tool_agent
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.chat import chat_ids
from memagent_jax.rollout.runner import AgentRunner
from memagent_jax.rollout.tool_calls import declare_tools
from tests.builders import ReplyEngine, qwen_like_tokenizer

TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "original_chat_template",
                        "Qwen2TokenizerFast.j2")
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
ANSWER = "It is 3 degrees in Oslo: \\boxed{3}"


def weather(city: str) -> str:
    """The temperature in a city.

    Args:
        city: the city's name
    """
    return f"{city}: 3 degrees"


def _tokenizer():
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    tool = build_tool_agent({"tools": [f"{__name__}:weather"]}, None)
    texts = [template, declare_tools(tool.declared), CALL, ANSWER,
             "What is the weather in Oslo? Oslo: 3 degrees"] * 3
    return qwen_like_tokenizer(texts, template)


@pytest.fixture(scope="module")
def tokenizer():
    return _tokenizer()


def _call_ids(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return tokenizer(CALL, add_special_tokens=False)["input_ids"] + [end]


def _rollout(tokenizer, answer_ids, max_tokens=64, max_turns=2, calls=1):
    """One rollout of the tool agent: the first `calls` replies call weather, the next
    `answer_ids`."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call_ids = _call_ids(tokenizer)

    def reply(prompt: str):
        return answer_ids if prompt.count("<tool_response>") >= calls else call_ids

    agent = build_tool_agent({"tools": [f"{__name__}:weather"], "max_tokens": max_tokens,
                              "max_turns": max_turns, "max_length": 1024}, None)
    runner = AgentRunner(Scheduler(ReplyEngine(tokenizer, reply)), tokenizer, (end,))
    row = example_from_row({"data_source": "weather", "prompt": "What is the weather in Oslo?",
                            "reward_model": {"ground_truth": "3"}}, 0)
    (trajectory,), = runner.run(agent, [row], SamplingParams(0.0))
    return trajectory, call_ids


def _oracle(tokenizer, turn):
    """The original template's ids and assistant mask for the conversation, with the agent's
    tools, each reply as the text it generated (the original trainer's messages) with the
    original's `finished` flag (a reply cut at its cap has no end token)."""
    messages = [{"role": m["role"], "content": m.reply.text if hasattr(m, "reply")
                 else m["content"]} for m in turn.messages]
    if turn.finish_reason != "stop":
        messages[-1]["finished"] = False
    tools = build_tool_agent({"tools": [f"{__name__}:weather"]}, None).declared
    rendered = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                             return_dict=True,
                                             return_assistant_tokens_mask=True)
    return list(rendered["input_ids"]), list(rendered["assistant_masks"])


def _ours(turn):
    return (turn.prompt_ids + turn.response_ids,
            [0] * len(turn.prompt_ids) + list(turn.response_mask))


@pytest.mark.parametrize("cut", [False, True], ids=["answered", "answer_cut_at_its_cap"])
def test_the_row_and_its_loss_mask_are_the_original_templates(tokenizer, cut):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cap = len(_call_ids(tokenizer))  # the call fits; an answer three times ANSWER does not
    answer = tokenizer(ANSWER * (3 if cut else 1), add_special_tokens=False)["input_ids"]
    trajectory, call_ids = _rollout(tokenizer, answer + [end], max_tokens=cap if cut else 64)
    (turn,) = trajectory.turns
    assert [m["role"] for m in turn.messages] == ["user", "assistant", "tool", "assistant"]
    assert turn.messages[2] == {"role": "tool", "tool_call_id": "call_0_0",
                                "content": "Oslo: 3 degrees"}
    assert turn.finish_reason == ("length" if cut else "stop")
    ids, mask = _ours(turn)
    assert (ids, mask) == _oracle(tokenizer, turn)
    # Trained: exactly the two replies' generated ids; the tool's result is not.
    trained = [t for t, m in zip(ids, mask) if m]
    assert trained == call_ids + (answer[:cap] if cut else answer + [end])
    tool_text = tokenizer.decode([t for t, m in zip(turn.response_ids, turn.response_mask)
                                  if not m])
    assert "Oslo: 3 degrees" in tool_text and "<tool_response>" in tool_text
    rows = rows_from_trajectories([trajectory], [1.0])
    np.testing.assert_array_equal(rows.loss_mask[0, :len(mask)], mask)
    assert rows.loss_mask[0].sum() == len(trained)


def test_generated_ids_are_trained_where_the_text_would_tokenize_otherwise(tokenizer):
    """The answer generated one byte-level piece at a time: the same text, other ids than its
    canonical tokenization. The row holds the generated ids and masks exactly them; the
    template's rendering re-tokenizes the text and would train other ids."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    canonical = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.convert_tokens_to_ids(c) for c in
              "".join(tokenizer.convert_ids_to_tokens(canonical))]
    assert len(pieces) > len(canonical) and tokenizer.decode(pieces) == ANSWER
    trajectory, call_ids = _rollout(tokenizer, pieces + [end])
    (turn,) = trajectory.turns
    ids, mask = _ours(turn)
    assert [t for t, m in zip(ids, mask) if m] == call_ids + pieces + [end]
    oracle_ids, oracle_mask = _oracle(tokenizer, turn)
    assert ids != oracle_ids and tokenizer.decode(ids) == tokenizer.decode(oracle_ids)
    assert [t for t, m in zip(oracle_ids, oracle_mask) if m] == call_ids + canonical + [end]
    assert trajectory.answer == "3"


def test_four_calls_are_one_row_each_reply_trained_with_its_own_logprobs(tokenizer):
    """Three tool calls, then the answer: each call continues the latest call its messages
    extend (the first would match too), so the conversation is one row, the original
    template's tokens and mask; each reply's generated ids carry their own behaviour log-probs
    at their own positions (0 on the tool tokens); its tokens and replies are counted on the
    mask."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [end]
    trajectory, call_ids = _rollout(tokenizer, answer, max_turns=3, calls=3)
    assert len(trajectory.turns) == 1
    (turn,) = trajectory.turns
    assert [m["role"] for m in turn.messages] == ["user"] + ["assistant", "tool"] * 3 \
        + ["assistant"]
    ids, mask = _ours(turn)
    assert (ids, mask) == _oracle(tokenizer, turn)
    replies = [m.reply for m in turn.messages if m["role"] == "assistant"]
    generated = [t for r in replies for t in r.token_ids]
    assert [r.token_ids for r in replies] == [call_ids] * 3 + [answer]
    assert [t for t, m in zip(ids, mask) if m] == generated
    behaviour = [p for r in replies for p in r.logprobs]
    assert len(set(behaviour)) > 1  # the scripted engine's differ: a shift would show
    assert [p for p, m in zip(turn.response_logprobs, mask[len(turn.prompt_ids):]) if m] \
        == behaviour
    assert not any(p for p, m in zip(turn.response_logprobs, turn.response_mask) if not m)
    assert turn.replies() == [(len(call_ids), 64)] * 3 + [(len(answer), 64)]
    assert turn.generated_tokens == len(generated) < len(turn.response_ids)
    assert trajectory.record()["turns"][0]["response_tokens"] == len(generated)
    rows = rows_from_trajectories([trajectory], [1.0])
    p = len(turn.prompt_ids)
    np.testing.assert_array_equal(rows.rollout_logprobs[0, p:p + len(turn.response_ids)],
                                  np.asarray(turn.response_logprobs, np.float32))
    assert trajectory.answer == "3"


class _TwoCalls:
    """An agent of two calls in one conversation: the question, the reply, `then` (a user
    turn), the second reply."""
    name = "two calls"

    def __init__(self, first_cap=64, then="And again?"):
        self.first_cap, self.then = first_cap, then

    async def rollout(self, row, policy):
        messages = [{"role": "user", "content": row.question}]
        first = await policy.chat(messages, max_tokens=self.first_cap)
        messages += [first.message, {"role": "user", "content": self.then}]
        second = await policy.chat(messages, max_tokens=64)
        return [messages + [second.message]]


def _run_two_calls(tokenizer, replies, first_cap=64):
    """The trajectory of `_TwoCalls` on the scripted engine: call k answered replies[k]."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def reply(prompt: str):
        return replies[prompt.count("<|im_start|>user") - 1]

    runner = AgentRunner(Scheduler(ReplyEngine(tokenizer, reply)), tokenizer, (end,))
    row = example_from_row({"data_source": "t", "prompt": "What is the weather in Oslo?",
                            "reward_model": {"ground_truth": "3"}}, 0)
    (trajectory,), = runner.run(_TwoCalls(first_cap), [row], SamplingParams(0.0))
    return trajectory


def test_every_token_the_runner_or_template_adds_has_no_loss_and_no_behaviour_logprob(
        tokenizer):
    """The first reply is cut at its cap (no end token sampled); the template closes it with
    `<|im_end|>` when the conversation goes on, then writes the separator, the user turn and
    the generation prompt. Exactly the sampled ids carry loss and a behaviour log-prob; the
    inserted end-of-turn, separators and generation prompt carry 0 in the row, the batch's
    loss mask and its behaviour log-probs (SkyRL #758: an appended EOS trained with
    log-prob 0)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    cap = 4
    trajectory = _run_two_calls(tokenizer, [answer + [end], answer + [end]], first_cap=cap)
    (turn,) = trajectory.turns
    first, second = [m.reply for m in turn.messages if m["role"] == "assistant"]
    assert first.finish_reason == "length" and first.token_ids == answer[:cap]
    p = len(turn.prompt_ids)
    starts = [len(r.prompt_ids) - p for r in (first, second)]
    sampled = {s + k for s, r in zip(starts, (first, second)) for k in range(len(r.token_ids))}
    assert {k for k, m in enumerate(turn.response_mask) if m} == sampled
    assert all(lp == 0.0 for k, lp in enumerate(turn.response_logprobs) if k not in sampled)
    assert all(lp != 0.0 for k, lp in enumerate(turn.response_logprobs) if k in sampled)
    inserted = turn.response_ids[cap:starts[1]]
    assert inserted[0] == end  # the end-of-turn the engine did not sample
    assert tokenizer.decode(inserted) == ("<|im_end|>\n<|im_start|>user\nAnd again?<|im_end|>"
                                          "\n<|im_start|>assistant\n")
    assert tokenizer.decode(turn.prompt_ids).endswith("<|im_start|>assistant\n")
    rows = rows_from_trajectories([trajectory], [1.0])
    length = p + len(turn.response_ids)
    expected = np.zeros(length)
    expected[[p + k for k in sampled]] = 1
    np.testing.assert_array_equal(rows.loss_mask[0, :length], expected)
    assert not rows.rollout_logprobs[0, :length][expected == 0].any()


QWEN3 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "original_chat_template",
                     "Qwen3.j2")
THOUGHT = "<think>\nThe user asks the weather.\n</think>\n\n"


def test_a_two_call_qwen3_thinking_conversation_trains_each_call_as_it_was_prompted():
    """Qwen3's template (tests/original_chat_template/Qwen3.j2) renders an assistant message's
    think block only after the last user query: once the user speaks again, the first reply's
    thinking is gone from the prompt. So the second call's prompt is the template's rendering,
    the first reply without its thinking (the model is asked what Qwen3 is asked), and cannot
    extend the first call's ids; the conversation is two rows, each its call's prompt and the
    ids generated for it, thinking included (generated ids win over the template's
    re-rendering); the answer is the last reply's."""
    with open(QWEN3, encoding="utf-8") as f:
        template = f.read()
    tokenizer = qwen_like_tokenizer([template, THOUGHT, ANSWER, "What is the weather in "
                                     "Oslo? And again?"] * 3, template)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    replies = [tokenizer(THOUGHT + ANSWER, add_special_tokens=False)["input_ids"] + [end],
               tokenizer(THOUGHT + "Still \\boxed{4}", add_special_tokens=False)["input_ids"]
               + [end]]
    trajectory = _run_two_calls(tokenizer, replies)
    first, second = trajectory.turns
    messages = first.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    second_prompt = tokenizer.decode(second.prompt_ids)
    assert second.prompt_ids == chat_ids(tokenizer, messages[:3])
    assert second_prompt == ("<|im_start|>user\nWhat is the weather in Oslo?<|im_end|>\n"
                             f"<|im_start|>assistant\n{ANSWER}<|im_end|>\n"
                             "<|im_start|>user\nAnd again?<|im_end|>\n<|im_start|>assistant\n")
    assert "The user asks" not in second_prompt
    assert first.prompt_ids == chat_ids(tokenizer, messages[:1])
    assert (first.response_ids, second.response_ids) == tuple(replies)
    assert first.response_mask is None and second.response_mask is None  # all trained
    assert [t.kind for t in trajectory.turns] == ["final", "final"]
    # The answer is the conversation's last reply, in its second row.
    assert trajectory.answer == "4" and trajectory.record()["final_reply"].endswith("{4}")


def test_a_qwen3_tool_conversation_keeps_its_thinking_and_is_one_row():
    """Within one user query (tool turns), Qwen3's template keeps each reply's think block:
    the second call extends the first call's ids and the ids generated for it (thinking
    included), the tool's response after them; one row, the template's own tokens, every
    generated id trained."""
    with open(QWEN3, encoding="utf-8") as f:
        template = f.read()
    tool = build_tool_agent({"tools": [f"{__name__}:weather"], "max_turns": 1}, None)
    tokenizer = qwen_like_tokenizer([template, THOUGHT, CALL, ANSWER, declare_tools(
        tool.declared), "What is the weather in Oslo? Oslo: 3 degrees"] * 3, template)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = tokenizer(THOUGHT + CALL, add_special_tokens=False)["input_ids"] + [end]
    answer = tokenizer(THOUGHT + ANSWER, add_special_tokens=False)["input_ids"] + [end]

    def reply(prompt: str):
        return answer if "<tool_response>" in prompt else call

    runner = AgentRunner(Scheduler(ReplyEngine(tokenizer, reply)), tokenizer, (end,))
    row = example_from_row({"data_source": "t", "prompt": "What is the weather in Oslo?",
                            "reward_model": {"ground_truth": "3"}}, 0)
    (trajectory,), = runner.run(tool, [row], SamplingParams(0.0))
    (turn,) = trajectory.turns
    assert [m["role"] for m in turn.messages] == ["user", "assistant", "tool", "assistant"]
    assert [t for t, m in zip(turn.response_ids, turn.response_mask) if m] == call + answer
    rendered = chat_ids(tokenizer, turn.messages[:3], tools=tool.declared)
    assert turn.messages[-1].reply.prompt_ids == rendered
    assert "The user asks the weather." in tokenizer.decode(rendered)
    assert trajectory.answer == "3"
