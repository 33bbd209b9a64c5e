"""The lookup task's agent on the official `openai` client with `tools=`: one call, the tool
run here against the row's table, the `tool` message sent back, then the answer. Its endpoint
and key come from OPENAI_BASE_URL and OPENAI_API_KEY (any OpenAI-compatible server).

Reads a lookup row (memagent-jax's `data lookup`) as JSON on standard input; prints the answer.
    memagent-jax train --config configs/lookup/program_openai.yaml
"""

import json
import sys

from openai import OpenAI

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look up the code of a key.",
    "parameters": {"type": "object",
                   "properties": {"key": {"type": "string", "description": "the key"}},
                   "required": ["key"]}}}
MAX_CALLS = 2  # replies that call the tool; the reply after the last is the answer


def lookup(codes: dict, arguments: str) -> str:
    try:
        key = json.loads(arguments)["key"]
    except (ValueError, KeyError, TypeError):
        return "error: lookup takes key (required: key)"
    return f"the code of {key} is {codes[key]} ." if key in codes else "no such key ."


def main() -> None:
    row = json.load(sys.stdin)
    codes = dict(row["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]["table"])
    prompt = row["prompt"]  # the train layout's chat messages, or the eval layout's text
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    client = OpenAI()
    for calls in range(MAX_CALLS + 1):
        reply = client.chat.completions.create(model="policy", messages=messages,
                                               tools=[LOOKUP], max_tokens=32)
        message = reply.choices[0].message
        if not message.tool_calls or calls == MAX_CALLS:
            break
        messages.append(message)
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": lookup(codes, call.function.arguments)})
    print(message.content)


main()
