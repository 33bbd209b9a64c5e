"""The lookup task's agent on the OpenAI Agents SDK (`openai-agents`), as one runs it against
any OpenAI-compatible provider: a function tool, the chat-completions model on an `AsyncOpenAI`
client, tracing off. Its endpoint and key come from OPENAI_BASE_URL and OPENAI_API_KEY.

Reads a lookup row (memagent-jax's `data lookup`) as JSON on standard input; prints the answer.
    memagent-jax train --config configs/lookup/program_agents_sdk.yaml

The tool is a `FunctionTool` with its JSON schema written out, not strict: `@function_tool`
derives a schema with pydantic's titles and `additionalProperties`, words the lookup model's
tokenizer has never seen (a model with a real vocabulary reads either).
"""

import asyncio
import json
import sys

from agents import (Agent, FunctionTool, ModelSettings, OpenAIChatCompletionsModel, Runner,
                    set_tracing_disabled)
from agents.exceptions import AgentsException
from openai import AsyncOpenAI

PARAMETERS = {"type": "object",
              "properties": {"key": {"type": "string", "description": "the key"}},
              "required": ["key"]}


def question(row: dict) -> str:
    prompt = row["prompt"]  # the train layout's chat messages, or the eval layout's text
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


async def main() -> None:
    row = json.load(sys.stdin)
    codes = dict(row["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]["table"])

    async def lookup(context, arguments: str) -> str:
        try:
            key = json.loads(arguments)["key"]
        except (ValueError, KeyError, TypeError):
            return "error: lookup takes key (required: key)"
        return f"the code of {key} is {codes[key]} ." if key in codes else "no such key ."

    tool = FunctionTool(name="lookup", description="Look up the code of a key.",
                        params_json_schema=PARAMETERS, on_invoke_tool=lookup,
                        strict_json_schema=False)
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="policy", openai_client=AsyncOpenAI())
    agent = Agent(name="lookup", model=model, tools=[tool],
                  model_settings=ModelSettings(max_tokens=32))
    try:  # two replies that call the tool, then the answer
        result = await Runner.run(agent, question(row), max_turns=3)
        print(result.final_output)
    except AgentsException as e:  # past max_turns, or a call of no tool: no answer
        print(f"no answer ({type(e).__name__})")


asyncio.run(main())
