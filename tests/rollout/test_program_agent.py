"""Any program as an agent (agents/program.py): an unmodified program on the official `openai`
client, its base URL and key from the environment, is recorded as the same agent written as a
function is (ids, behaviour log-probs, conversations); a crash is one line naming the command
and the row; a program past the run's deadline is killed and its rollout timed out. Each as a
process of its own and forked from a server that preloaded `openai` (`agent.preload`)."""

import dataclasses
import json
import sys
import textwrap
import time
import types

import pytest

from memagent_jax.agents.tool_calling import build as build_tool_agent
from memagent_jax.data.pipeline import example_from_row
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Scheduler
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.rollout.agent_api import load_agent
from memagent_jax.rollout.rollouts import Limits
from memagent_jax.rollout.runner import AgentRunner, build_runner
from tests.builders import EOS, ReplyEngine, two_conversations
from tests.rollout.test_chat_masks import ANSWER, _call_ids, _tokenizer

# Two calls that continue one another (one conversation), then one of its own.
PROGRAM = """\
import json
import sys

from openai import OpenAI

row = json.load(sys.stdin)
client = OpenAI()
messages = [{"role": "user", "content": row["question"]}]
first = client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
messages += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "is it ?"}]
client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "the ?"}])
"""


def _runner(word_tokenizer):
    def reply(prompt):  # a reply that depends on the prompt
        words = "the answer is" if prompt.count("?") % 2 else "is the answer"
        return word_tokenizer(words, add_special_tokens=False)["input_ids"] + [EOS]

    return AgentRunner(Scheduler(ReplyEngine(word_tokenizer, reply)), word_tokenizer, (EOS,))


@pytest.fixture(params=[(), ("openai",)], ids=["spawned", "forked"])
def preload(request):
    return list(request.param)


def _program(tmp_path, text, preload=(), **settings):
    path = tmp_path / "my_app.py"
    path.write_text(textwrap.dedent(text))
    return load_agent({"module": "memagent_jax.agents.program", "preload": list(preload),
                       "command": [sys.executable, str(path)], "max_tokens": 16, **settings},
                      None)


ROWS = [types.SimpleNamespace(question=q, index=k) for k, q in enumerate(("where is it ?",
                                                                           "is the ?"))]
SAMPLING = SamplingParams(0.7, seed=11)


def test_an_openai_client_program_is_recorded_as_the_same_function_agent(
        model, params, word_tokenizer, tmp_path, preload):
    """On the tiny model, sampled: every call's seed is the run's, the same in both."""
    function_agent = types.SimpleNamespace(rollout=two_conversations, name="f")
    runner = build_runner(function_agent, model, word_tokenizer,
                          EngineConfig(slots=4, max_len=96), None, (EOS,)).with_params(params)
    program = runner.run(_program(tmp_path, PROGRAM, preload), ROWS[1:], SAMPLING, n=2)
    function = runner.run(function_agent, ROWS[1:], SAMPLING, n=2)
    first, second = program[0]
    assert first.turns[0].response_ids != second.turns[0].response_ids  # seeded per rollout
    for mine, theirs in zip(sum(program, []), sum(function, [])):
        assert [t.kind for t in mine.turns] == ["turn", "final"]
        assert len(mine.turns) == len(theirs.turns) == 2
        for a, b in zip(mine.turns, theirs.turns):
            assert (a.prompt_ids, a.response_ids, a.response_logprobs, a.response_mask,
                    a.caps) == (b.prompt_ids, b.response_ids, b.response_logprobs,
                                b.response_mask, b.caps)
        assert sum(mine.turns[0].response_mask) == sum(b for b, _ in mine.turns[0].replies())
        assert len(mine.turns[0].replies()) == 2  # two replies, one row
        assert mine.final_reply == theirs.final_reply  # the last call's


def test_a_crashing_program_fails_its_rollout_in_one_line(word_tokenizer, tmp_path, preload):
    agent = _program(tmp_path, "import json, sys\nrow = json.load(sys.stdin)\n"
                               "raise ValueError('no answer for ' + row['question'])\n",
                     preload)
    with pytest.raises(UserError) as failed:
        _runner(word_tokenizer).run(agent, ROWS[:1], SAMPLING)
    assert str(failed.value) == (f"agent program `{sys.executable} {tmp_path / 'my_app.py'}` "
                                 "on row 0: exited with status 1: ValueError: no answer for "
                                 "where is it ?")
    caught = _program(tmp_path, "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
                                "    traceback.print_exc()\n", preload)
    with pytest.raises(UserError, match="on row 0: wrote a traceback: ZeroDivisionError: "):
        _runner(word_tokenizer).run(caught, ROWS[:1], SAMPLING)
    quiet = _program(tmp_path, "print('nothing asked')\n", preload)
    with pytest.raises(UserError, match="on row 0: made no chat completion at http://127.0.0.1:"):
        _runner(word_tokenizer).run(quiet, ROWS[:1], SAMPLING)
    exits = _program(tmp_path, "import sys\nsys.exit('no answer')\n", preload)
    with pytest.raises(UserError, match="on row 0: exited with status 1: no answer\n"):
        _runner(word_tokenizer).run(exits, ROWS[:1], SAMPLING)
    with pytest.raises(ConfigError, match="agent.command"):
        load_agent({"module": "memagent_jax.agents.program", "command": []}, None)


def test_a_program_past_the_deadline_is_killed_and_its_rollout_timed_out(word_tokenizer,
                                                                         tmp_path, preload):
    """With the process it started (which holds its standard error open)."""
    pids = tmp_path / "pids"
    agent = _program(tmp_path, f"""\
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(600)
        """, preload)
    runner = _runner(word_tokenizer).with_limits(Limits(timeout_s=3.0))
    start = time.monotonic()
    (trajectory,), = runner.run(agent, ROWS[:1], SAMPLING)
    assert time.monotonic() - start < 60  # not until the program's child ends by itself
    assert trajectory.timed_out and not trajectory.turns
    program, started = map(int, pids.read_text().split())
    assert not _running(program) and not _running(started)


def _running(pid: int, wait_s: float = 10.0) -> bool:
    """Whether the process is still there (not ended, or a zombie) after up to wait_s."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1][0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True


# A program that leaves work for the interpreter's exit: a pool's task, an atexit function, a
# file it never flushes or closes; it reports what it sees of its process, then raises where
# its tag says so (the last argument: MODE-FORM-crash).
EXITING = """\
import atexit, concurrent.futures, json, os, sys, time, urllib.request
import counted
row = json.load(sys.stdin)
tag, out = sys.argv[-1], os.environ["OUT"]
log = open(os.path.join(out, tag + ".log"), "w")
def note(text):
    log.write(text)
def late():
    time.sleep(0.3)
    note("from the pool's thread")
pool = concurrent.futures.ThreadPoolExecutor(2)
pool.submit(late)
atexit.register(lambda: open(os.path.join(out, tag + ".atexit"), "w").write("ran"))
MARK = "the program's"
import __main__
with open(os.path.join(out, tag + ".json"), "w") as f:
    json.dump({"argv": [os.path.basename(a) for a in sys.argv[:-1]], "path0": sys.path[0],
               "cwd": os.getcwd(), "url": os.environ["OPENAI_BASE_URL"][:17],
               "question": row["question"], "main": getattr(__main__, "MARK", None),
               "file": os.path.basename(globals().get("__file__", "-"))}, f)
urllib.request.urlopen(urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    json.dumps({"model": "p", "messages": [{"role": "user", "content": "is it ?"}]}).encode(),
    {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}))
if tag.endswith("crash"):
    def fails():
        raise ValueError("late")
    fails()
"""


def test_a_forked_program_runs_as_the_command_would(word_tokenizer, tmp_path, monkeypatch):
    """`python SCRIPT ARGS`, `-m MODULE`, `-c CODE` forked from the server as run by the
    interpreter: the same argv, `sys.path[0]` (where the preloaded module is found: beside the
    script), working directory, environment, input, `__main__`, traceback, and the same exit
    (the pool's thread waited for, atexit run, an open file flushed); the preloaded module is
    imported once for every rollout; a module the server cannot import, or a command it cannot
    run, is one line."""
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "my_mod.py").write_text(EXITING)
    imports = tmp_path / "imports"
    (code_dir / "counted.py").write_text(f"open({str(imports)!r}, 'a').write('imported\\n')\n")
    monkeypatch.chdir(code_dir)  # -m and -c find my_mod and counted in the working directory
    monkeypatch.setenv("OUT", str(tmp_path))
    forms = {"script": [str(code_dir / "my_mod.py")], "m": ["-m", "my_mod"], "c": ["-c", EXITING]}
    runner = _runner(word_tokenizer).with_limits(Limits(timeout_s=60.0))  # an exit that hangs
    stderr = {}
    for mode, preload in (("spawned", []), ("forked", ["counted"])):
        for form, command in forms.items():
            for end in ("ok", "crash"):
                tag = f"{mode}-{form}-{end}"
                agent = load_agent({"module": "memagent_jax.agents.program", "preload": preload,
                                    "command": [sys.executable, *command, tag]}, None)
                if end == "ok":
                    groups = runner.run(agent, ROWS[:1], SAMPLING, n=2)
                    assert all(len(t.turns) == 1 for t in groups[0])
                    continue
                with pytest.raises(UserError) as failed:
                    runner.run(agent, ROWS[:1], SAMPLING)
                stderr[mode, form] = str(failed.value).split(": exited with status 1: ")[1]
        # spawned: once a rollout (9); forked: once a server (6 more)
        assert imports.read_text().count("imported") == {"spawned": 9, "forked": 15}[mode]
    for form in forms:
        for end in ("ok", "crash"):
            spawned, forked = (json.loads((tmp_path / f"{m}-{form}-{end}.json").read_text())
                               for m in ("spawned", "forked"))
            assert forked == spawned, form
            for m in ("spawned", "forked"):
                tag = tmp_path / f"{m}-{form}-{end}"
                assert (tag.with_suffix(".log").read_text(), tag.with_suffix(".atexit")
                        .read_text()) == ("from the pool's thread", "ran"), (m, form, end)
        assert stderr["forked", form] == stderr["spawned", form] == "ValueError: late"
    script = json.loads((tmp_path / "forked-script-ok.json").read_text())
    assert (script["main"], script["argv"], script["file"]) == ("the program's", ["my_mod.py"],
                                                                "my_mod.py")
    missing = load_agent({"module": "memagent_jax.agents.program", "preload": ["no_such_mod"],
                          "command": [sys.executable, "-c", "pass"]}, None)
    with pytest.raises(UserError) as failed:
        runner.run(missing, ROWS[:1], SAMPLING)
    assert str(failed.value) == (
        f"agent.preload: the fork server of `{sys.executable} -c pass` exited with status 1: "
        "ModuleNotFoundError: No module named 'no_such_mod'")
    for command, why in (([sys.executable], "got"), ([sys.executable, "-u", "x.py"], "-u"),
                         ([sys.executable, "-m"], "got")):
        with pytest.raises(ConfigError, match=f"agent.preload: runs agent.command as .*{why}"):
            load_agent({"module": "memagent_jax.agents.program", "preload": ["json"],
                        "command": command}, None)
    with pytest.raises(ConfigError, match="agent.preload: must be a list of module names"):
        load_agent({"module": "memagent_jax.agents.program", "preload": ["no such"],
                    "command": [sys.executable, "x.py"]}, None)


REFUSALS = """\
import json, os, socket, sys, urllib.error, urllib.request

def post(body):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
        {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        return [urllib.request.urlopen(request).status, ""]
    except urllib.error.HTTPError as e:
        return [e.code, json.load(e)["error"]["message"]]

messages = [{"role": "user", "content": "where is it ?"}]
out = [post({"model": "policy", "messages": messages, **extra}) for extra in (
    {"stop": ["is"]}, {"logprobs": True}, {"chat_template_kwargs": {"max_tokens": 3}}, {})]
host, port = os.environ["OPENAI_BASE_URL"].split("//")[1].split("/")[0].split(":")
with socket.create_connection((host, int(port))) as raw:
    raw.sendall(b"GARBAGE\\r\\n\\r\\n")
    out.append(raw.recv(100).decode().split("\\r\\n")[0])
json.dump(out, open(sys.argv[1], "w"))
"""


def test_what_the_engine_would_not_honour_is_a_400_not_ignored(word_tokenizer, tmp_path):
    """`stop`, `logprobs` and template variables named as the call's own arguments are refused
    (a reply cut at no stop string would be trained as if cut); a request that is not HTTP is
    a 400; the program goes on and its last call is recorded."""
    out = tmp_path / "out.json"
    agent = _program(tmp_path, REFUSALS)
    agent.section = dataclasses.replace(agent.section,
                                        command=(*agent.section.command, str(out)))
    (trajectory,), = _runner(word_tokenizer).run(agent, ROWS[:1], SAMPLING)
    (stop, stop_why), (logprobs, _), (clash, clash_why), (fine, _), garbage = json.loads(
        out.read_text())
    assert (stop, logprobs, clash, fine) == (400, 400, 400, 200)
    assert "'stop' is not taken by a rollout's endpoint" in stop_why
    assert "'max_tokens' is one of the call's own arguments" in clash_why
    assert garbage == "HTTP/1.1 400 Bad Request"
    assert len(trajectory.turns) == 1 and trajectory.final_reply


TOOL_PROGRAM = """\
import json
import sys

from openai import OpenAI

row = json.load(sys.stdin)
tools = json.loads(sys.argv[1])
client = OpenAI()
messages = list(row["prompt"])
first = client.chat.completions.create(model="policy", messages=messages, tools=tools,
                                       max_tokens=64)
choice = first.choices[0]
assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
(call,) = choice.message.tool_calls
city = json.loads(call.function.arguments)["city"]
messages += [choice.message,
             {"role": "tool", "tool_call_id": call.id, "content": f"{city}: 3 degrees"}]
client.chat.completions.create(model="policy", messages=messages, tools=tools, max_tokens=64)
"""


def test_a_program_calling_tools_is_recorded_as_the_shipped_tool_agent(preload):
    """`tools=` through the official client: the reply's call comes back as `tool_calls`, the
    `role: tool` message answers it, and the conversation is the row the shipped tool agent
    makes of the same calls (Qwen2.5's template, which takes `tools`)."""
    tokenizer = _tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [end]

    def reply(prompt):
        return answer if "<tool_response>" in prompt else _call_ids(tokenizer)

    shipped = build_tool_agent({"tools": ["tests.rollout.test_chat_masks:weather"],
                                "max_tokens": 64, "max_turns": 1}, None)
    program = load_agent({"module": "memagent_jax.agents.program", "command": [
        sys.executable, "-c", TOOL_PROGRAM, json.dumps(shipped.declared)], "max_tokens": 64,
                          "preload": preload}, None)
    row = example_from_row({"data_source": "t", "prompt": [
        {"role": "user", "content": "What is the weather in Oslo?"}],
        "reward_model": {"ground_truth": "3"}}, 0)
    runner = AgentRunner(Scheduler(ReplyEngine(tokenizer, reply)), tokenizer, (end,))
    ((mine,),), ((theirs,),) = (runner.run(a, [row], SAMPLING) for a in (program, shipped))
    assert len(mine.turns) == len(theirs.turns) == 1
    a, b = mine.turns[0], theirs.turns[0]
    assert (a.prompt_ids, a.response_ids, a.response_logprobs, a.response_mask) == (
        b.prompt_ids, b.response_ids, b.response_logprobs, b.response_mask)
    assert sum(a.response_mask) == len(_call_ids(tokenizer)) + len(answer)
    assert mine.answer == theirs.answer == "3"
