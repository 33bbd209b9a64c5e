"""Chat calls as token ids, and conversations as the rows that train them.

What is trained is what was generated (verl's agent loop: token in, token out). A call's prompt
is its messages through the chat template, except where it continues an earlier call of the
same rollout (its messages are that call's messages, that call's reply, then more: a tool
result, a user turn; the latest such call, `continued`): then the prompt is the earlier
prompt's ids, the ids the engine generated for that reply, then the template's own text for
what follows, tokenized. So a reply the template would render otherwise (a merge the tokenizer
never makes, thinking the template strips, a reply cut at its cap) reaches the next call, and
the training row, as the ids it was. A server's calls (text, no ids) continue one another the
same way (`rollout/client.py`), so their conversations group as the engine's do.

`conversation_turns` turns a conversation the agent returns into `Turn`s: each chain of calls
that continue one another is one row, its prompt the first call's, its response everything
after, with 1 in `response_mask` on the generated ids only (prompt, user and tool tokens carry
no loss); a server's chain is one row of text, its last reply the row's. A one-call
conversation is that call's prompt and reply, as MemAgent's turns are.
"""

from __future__ import annotations

import dataclasses

from memagent_jax.errors import UserError
from memagent_jax.rollout.agent_api import Reply, Turn
from memagent_jax.rollout.chat import chat_ids
from memagent_jax.rollout.tool_calls import declare_tools, render_input
from memagent_jax.tokenizer import PIECE_IDS, check_representable, unreadable_parts

# Rendered in place of a reply's content to find where the template's text after a reply
# begins; no template writes it. With a think block of its own: a template that writes an
# earlier reply's thinking only where there is some (Qwen3's, within one user query) renders
# the marked reply as it renders a reply that thought.
_REPLY = "\u2063memagent-jax reply\u2063"
_MARKED = f"<think>\n{_REPLY}\n</think>\n\n{_REPLY}"


@dataclasses.dataclass(eq=False)
class Call:
    """One chat call of a rollout: its messages (None when the prompt was given as ids),
    template variables, prompt ids, max_tokens, the call it continues (None: a fresh prompt),
    and its reply once answered."""
    messages: list[dict] | None
    template_vars: dict
    prompt_ids: list[int]
    max_tokens: int
    parent: Call | None = None
    reply: Reply | None = None


class ChatPrompts:
    """Prompt ids for chat calls in one tokenizer (module docstring)."""

    def __init__(self, tokenizer, stop_ids: tuple[int, ...]):
        self.tokenizer, self.stop_ids = tokenizer, frozenset(stop_ids)
        self._stop_text: dict[int, str] = {}

    def prompt(self, messages: list[dict] | None, template_vars: dict, earlier: list[Call]
               ) -> tuple[list[int], Call | None]:
        """(the prompt ids of `messages`, the earlier call they continue or None); text
        outside a word tokenizer's vocabulary is a UserError naming its message
        (`check_readable`)."""
        messages = check_messages(messages, "policy.chat's messages")
        for call in reversed(earlier):
            if continues(messages, template_vars, call):
                ids = self._continue(call, messages, template_vars)
                if ids is not None:
                    return ids, call
        return readable_chat_ids(self.tokenizer, messages, template_vars), None

    def _continue(self, call: Call, messages: list[dict], template_vars: dict
                  ) -> list[int] | None:
        """The ids of `messages`, which continue `call`, built on its ids; None where its
        reply has no ids, or the template renders the earlier part differently once more
        follows."""
        if call.reply is None or call.reply.token_ids is None or call.messages is None:
            return None
        m = len(call.messages)
        head = messages[:m] + [{"role": "assistant", "content": _MARKED}]
        closed = self._render(head, False, template_vars)
        full = self._render(head + messages[m + 1:], True, template_vars)
        if not full.startswith(closed) or _REPLY not in closed:
            return None
        after = closed[closed.rindex(_REPLY) + len(_REPLY):]
        generated = call.reply.token_ids
        if generated and generated[-1] in self.stop_ids:
            # The template closes the reply with the token that stopped it: generated already.
            stop = self._decoded_stop(generated[-1])
            if after.startswith(stop):
                after = after[len(stop):]
        added = list(self.tokenizer.encode(after + full[len(closed):], add_special_tokens=False))
        check_readable(self.tokenizer, added, messages, template_vars, first=m + 1)
        return list(call.prompt_ids) + list(generated) + added

    def _render(self, messages, generation_prompt: bool, template_vars: dict) -> str:
        return render(self.tokenizer, messages, generation_prompt, template_vars)

    def _decoded_stop(self, token: int) -> str:
        if token not in self._stop_text:
            self._stop_text[token] = self.tokenizer.decode([token])
        return self._stop_text[token]


def render(tokenizer, messages: list[dict], generation_prompt: bool, template_vars: dict) -> str:
    """The messages as the chat template's text (tools and tool calls as `render_input`
    gives them)."""
    messages, template_vars = render_input(tokenizer, messages, template_vars)
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=generation_prompt,
                                         **template_vars)


def continues(messages: list[dict], template_vars: dict, call: Call) -> bool:
    """Whether `messages` continue `call` (module docstring): its messages, its reply, then
    more, with the same template variables."""
    if call.reply is None or call.messages is None or call.template_vars != template_vars:
        return False
    m = len(call.messages)
    return (len(messages) > m + 1 and is_reply(messages[m], call.reply)
            and messages[:m] == call.messages)


def continued(messages: list[dict], template_vars: dict, earlier: list[Call]) -> Call | None:
    """The latest of `earlier` that `messages` continue (`continues`), or None: the call a
    text-only policy's call extends, as `ChatPrompts.prompt` extends it in ids."""
    return next((call for call in reversed(earlier)
                 if continues(messages, template_vars, call)), None)


def is_reply(message, reply: Reply) -> bool:
    """Whether `message` is `reply` as a chat message: its own `reply.message`, or an assistant
    message with the same content and tool calls."""
    return message is reply.message or (
        isinstance(message, dict) and message.get("role") == "assistant"
        and (message.get("content") or "") == reply.message["content"]
        and message.get("tool_calls") == reply.message.get("tool_calls"))


def check_messages(messages, what: str) -> list[dict]:
    """`messages`, or a UserError naming `what` (a call's messages, a returned conversation)
    unless they are a non-empty list of chat messages: dicts with string 'role' and
    'content' (None too in an assistant message with 'tool_calls', as OpenAI's)."""
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{what} must be a non-empty list of {{'role', 'content'}} dicts, got "
                        f"{messages!r:.100}")
    for k, message in enumerate(messages):
        if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
                or not (isinstance(message.get("content"), str)
                        or message.get("content") is None and message.get("tool_calls"))):
            raise UserError(f"{what}, message {k} must be a dict with string 'role' and "
                            f"'content', got {message!r:.100}")
    return messages


def readable_chat_ids(tokenizer, messages: list[dict], template_vars: dict) -> list[int]:
    """The prompt ids of `messages` through the chat template, checked (`check_readable`): the
    one check of chat text, on the engine (`ChatPrompts`) and in `serve`."""
    ids = chat_ids(tokenizer, messages, **template_vars)
    check_readable(tokenizer, ids, messages, template_vars)
    return ids


def check_readable(tokenizer, ids: list[int], messages: list[dict], template_vars: dict,
                   first: int = 0) -> None:
    """Where `ids` (a chat prompt's, or what messages[first:] added to an earlier call's) hold
    a word tokenizer's pieces of text outside its vocabulary (from `PIECE_IDS` on: no model has
    rows for them), a UserError naming the words (`check_representable`) and the message at
    fault. What is judged is the prompt the chat template renders (`render`: tools and tool
    calls as the model reads them), not the messages' raw text (a template that collapses
    whitespace reads '\\n\\n' as ' ': no fault); text read as the unknown token reaches the
    model as that token, an id it has rows for, and passes. The part at fault: the call's
    tools (their declaration in a system message) or a message whose own unreadable words are
    in the prompt; a message whose role the template writes and the tokenizer cannot read; one
    the template writes as it is (whitespace is named with the words around it, which in the
    prompt may be the template's); else the prompt itself."""
    if not ids or max(ids) < PIECE_IDS:
        return

    def check(text: str, what: str, among: set[str] | None = None) -> None:
        check_representable(tokenizer, text, what, unknown=False, among=among)

    def content(i: int) -> str:
        return f"messages[{i}].content ({messages[i]['role']})"

    rendered = render(tokenizer, messages, True, template_vars)
    unread = set(unreadable_parts(tokenizer, rendered, unknown=False))
    if first == 0 and template_vars.get("tools"):
        check(declare_tools(template_vars["tools"]),
              "tools (as the system message declares them)", unread)
    own = {i: unreadable_parts(tokenizer, messages[i]["content"] or "", unknown=False)
           for i in range(first, len(messages))}
    for i in own:  # its words the prompt holds, not what the template rewrites
        check(messages[i]["content"] or "", content(i), unread)
    markup = render(tokenizer, [{**m, "content": ""} for m in messages], True, template_vars)
    roles = dict.fromkeys(["system", "user", "assistant", *(m["role"] for m in messages)])
    readable = [r for r in roles if not unreadable_parts(tokenizer, r, unknown=False)]
    for i in own:
        role = messages[i]["role"]
        if role not in readable and role in markup:
            raise UserError(f"messages[{i}].role: the chat template writes the role {role!r}, "
                            "which the tokenizer has no token for (the roles this model reads: "
                            f"{', '.join(readable) or 'none'})")
    for i, parts in own.items():
        if parts and (messages[i]["content"] or "") in rendered:
            check(messages[i]["content"] or "", content(i))
    check(rendered, "messages, as the chat template renders them")


def conversation_turns(conversation: list[dict], calls: dict[Reply, Call], kind: str
                       ) -> list[Turn]:
    """The rows of one conversation (module docstring), in order; `calls` maps this rollout's
    replies to their calls; kind: the rows' `Turn.kind` unless the conversation says
    (`Conversation.kind`); each row's `Turn.info` is the conversation's `Conversation.info`.
    Assistant messages that are no reply of this rollout are prompt."""
    found = []
    for k, message in enumerate(conversation):
        call = _call_of(message, conversation, k, calls)
        if call is not None and call not in found:
            found.append(call)
    covered: set[int] = set()
    chains = []
    for call in reversed(found):
        if id(call) in covered:
            continue
        chain = []
        while call is not None:
            chain.append(call)
            covered.add(id(call))
            call = call.parent
        chains.append(chain[::-1])
    label = getattr(conversation, "kind", None) or kind
    info = getattr(conversation, "info", {})
    return [_turn(chain, label, dict(info), list(conversation)) for chain in reversed(chains)]


def _call_of(message, conversation, k, calls: dict[Reply, Call]) -> Call | None:
    reply = getattr(message, "reply", None)
    if isinstance(reply, Reply) and reply in calls:
        return calls[reply]
    if not (isinstance(message, dict) and message.get("role") == "assistant"):
        return None
    return next((call for call in calls.values()
                 if call.reply is not None and is_reply(message, call.reply)
                 and call.messages == list(conversation[:k])), None)


def _turn(chain: list[Call], kind: str, info: dict, messages) -> Turn:
    first, last = chain[0], chain[-1]
    replies = [_answered(c) for c in chain]
    reply = replies[-1]
    if reply.token_ids is None:  # a server's replies: text only, nothing to train
        counts = [r.completion_tokens for r in replies if r.completion_tokens is not None]
        return Turn(kind, [], [], [], reply.finish_reason, reply.text, info,
                    caps=tuple(c.max_tokens for c in chain), messages=messages,
                    server_tokens=sum(counts) if len(counts) == len(chain) else None)
    prompt = list(first.prompt_ids)
    if len(chain) == 1:
        return Turn(kind, prompt, list(reply.token_ids), _logprobs(reply),
                    reply.finish_reason, reply.text, info,
                    caps=(last.max_tokens,), messages=messages)
    response = list(last.prompt_ids[len(prompt):]) + list(reply.token_ids)
    mask, logprobs = [0] * len(response), [0.0] * len(response)
    for call, r in zip(chain, replies):
        start = len(call.prompt_ids) - len(prompt)
        for t, logprob in enumerate(_logprobs(r)):
            mask[start + t], logprobs[start + t] = 1, logprob
    return Turn(kind, prompt, response, logprobs, reply.finish_reason, reply.text,
                info, mask, tuple(c.max_tokens for c in chain), messages)


def _answered(call: Call) -> Reply:
    """The reply of a call a conversation holds (every one is answered)."""
    assert call.reply is not None, "a conversation holds a call not answered yet"
    return call.reply


def _logprobs(reply: Reply) -> list[float]:
    """An engine reply's log-probabilities (it has them with its ids)."""
    assert reply.logprobs is not None, "an engine reply without log-probabilities"
    return list(reply.logprobs)
