"""The lookup experiment (docs/tools.md): its rows, its format-only start's targets (formats
shown, the task not), and its committed results: the start and the final as Hugging Face
exports that `transformers` loads with our logits, and the test table docs/results.md and
docs/tools.md quote, recomputed from the committed answers."""

import json
import os
import re

import pytest

from memagent_jax.agents.tool_calling import build as build_tool_agent
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.eval.compare import compare, read_run, wilson_interval
from memagent_jax.lookup import task
from memagent_jax.lookup.plugin import FormatPlugin, FormatSection
from memagent_jax.rollout.answers import extract_boxed
from memagent_jax.tokenizer import load_tokenizer
from tests.hf_reference import assert_trained_export_matches_transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results", "lookup_test")


def test_a_row_asks_a_key_its_table_holds_and_is_the_same_for_its_seed():
    row = task.make_row(7, 3)
    assert row == task.make_row(7, 3) != task.make_row(8, 3)
    table = dict(row["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]["table"])
    key = next(k for k in table if k in row["prompt"][0]["content"].split())
    assert row["reward_model"]["ground_truth"] == [table[key]] and len(table) == 4


def test_the_starts_targets_show_the_formats_and_not_the_task(tmp_path):
    """Over 120 rows: every target calls lookup with a word of its question and boxes a word
    of the tool's result, as the tool gave it; the asked key is called about one time in six
    (drawn, not chosen), and the answer is the code about as often as chance allows."""
    tokenizer = load_tokenizer(task.write_tokenizer(str(tmp_path / "tok")))
    agent = build_tool_agent({"tools": ["memagent_jax.lookup.tools:lookup"], "max_turns": 2},
                             None)
    agent.setup(tokenizer, (tokenizer.eos_token_id,))
    plugin = FormatPlugin(FormatSection(), seed=0)
    asked = right = 0
    for i in range(120):
        example = example_from_row(task.make_row(1, i), i)
        (turn,) = plugin.target(agent, example).turns
        user, call, result, answer = turn.messages
        (called,) = call["tool_calls"]
        name, arguments = called["function"]["name"], json.loads(called["function"]["arguments"])
        assert name == "lookup" and arguments["key"] in user["content"].split()
        assert result == {"role": "tool", "tool_call_id": called["id"],
                          "content": task_result(example, arguments["key"])}
        boxed = extract_boxed(answer["content"]).strip()
        assert boxed in result["content"].split()
        asked += arguments["key"] not in ("what", "is", "the", "code", "of", "which", "does",
                                          "have", "tell", "me", "for")
        right += boxed == example.ground_truths[0]
        assert sum(turn.response_mask) == len(tokenizer(call.reply.text + answer["content"],
                                                        add_special_tokens=False)["input_ids"]) + 2
    assert 10 <= asked <= 35 and right <= 10


def task_result(example, key):
    from memagent_jax.lookup.tools import lookup
    return lookup(key, example.extra_info["tools_kwargs"]["lookup"]["create_kwargs"]["table"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["start", "final"])
def test_the_exports_load_in_transformers_with_our_logits(name):
    assert_trained_export_matches_transformers(os.path.join(ROOT, "checkpoints", "lookup", name))


def _count(k: int, n: int) -> str:
    low, high = wilson_interval(k, n)
    return f"{k} ({100 * k / n:.1f} %, {100 * low:.1f}-{100 * high:.1f})"


def test_the_quoted_test_table_is_the_committed_answers():
    final, start = (read_run(os.path.join(RESULTS, m)) for m in ("final", "start"))
    (row,) = [r for r in compare(final, start) if r["metric"] == "em"]
    n, p = row["n"], f"{row['p']:.2g}"
    start_count, final_count = _count(row["b_right"], n), _count(row["a_right"], n)
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as f:
        assert f"| {n} | {start_count} | {final_count} | {p} |" in f.read()
    with open(os.path.join(ROOT, "docs", "tools.md"), encoding="utf-8") as f:
        assert (f"| {n} | {start_count} | {final_count} | {row['a_only']} / {row['b_only']} | "
                f"{p} |") in f.read()
    assert row["a_right"] >= 0.8 * n and row["b_right"] < 0.2 * n and row["p"] < 0.01
    assert re.search(r"seed 7301", open(os.path.join(ROOT, "configs", "eval",
                                                     "lookup_test.yaml")).read())
