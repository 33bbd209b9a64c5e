"""`serve` of memagent-tiny read by clients we did not write the loop of, and by ours:

- MemAgent's own evaluation client (taskutils/memory_eval, `ruler_hqa.py --api recurrent-boxed`:
  its request loop kept verbatim in tests/original_memory_eval/) answers as `memagent-jax eval`
  does, on a synthetic set in the original's file layout (a JSON list of records with context,
  input and answers). It reads the document with `AutoTokenizer` (as the original script
  does), cuts it into chunks of ids, decodes each and sends text; the server reads that text
  back with our tokenizer. Its settings come from the environment (its utils/envs.py): the
  chunk and reply budgets are set to the model's (memagent.json). It samples at the
  temperature it is given: 0 here, as the eval config's greedy decoding.
- `eval` with `model.url` answers as `eval` here, MemAgent by its own method or as any agent.
- `run --url` takes the budgets the model was trained with (memagent.json beside the
  tokenizer), as local `run` does: the same memories and answers, and --json records with the
  same keys; also on a document of every word the model reads, whose role words ("user",
  "assistant") its tokenizer decodes without their space."""

import asyncio
import contextlib
import importlib
import io
import json
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from memagent_jax.cli import main
from memagent_jax.model_dir import budgets, resolve
from memagent_jax.synthetic import tasks as synthetic
from tests.serve_helpers import serving

ROOT = Path(__file__).resolve().parents[2]
ORIGINAL = ROOT / "tests" / "original_memory_eval"
API_KEY = "123-abc"   # the original client's (utils/envs.py)
FRESH_SEED = 424242   # no set of the synthetic recipe used it


@pytest.fixture(scope="module")
def server():
    with serving(resolve("memagent-tiny"), api_key=API_KEY) as served:
        yield served


def _original_client(monkeypatch, port: int, chunk_tokens: int, reply_tokens: int):
    """utils.recurrent_boxed and utils, imported with the environment the original reads."""
    for name, value in {"SERVE_HOST": "127.0.0.1", "SERVE_PORT": str(port),
                        "RECURRENT_CHUNK_SIZE": str(chunk_tokens),
                        "RECURRENT_MAX_NEW": str(reply_tokens)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(ORIGINAL))
    for name in [m for m in sys.modules if m == "utils" or m.startswith("utils.")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("utils.recurrent_boxed"), importlib.import_module("utils")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """(a synthetic set of 6 multikey documents of 1K tokens in the original's layout, the
    eval config's arguments for it, `eval`'s samples of it on the local engine by row)."""
    tmp_path = tmp_path_factory.mktemp("evaluated")
    data = tmp_path / "data"
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "1024",
                 "--num-samples", "6", "--seed", "9", "--out", str(data)]) == 0
    config = ["--config", str(ROOT / "configs" / "eval" / "memagent_tiny.yaml"),
              f"data.sets=[{data / 'eval_multikey_1024.json'}]"]
    assert main(["eval", *config, f"output_dir={tmp_path / 'ours'}"]) == 0
    return data / "eval_multikey_1024.json", config, _samples(tmp_path / "ours")


def _samples(out) -> dict:
    with open(out / "samples" / "eval_multikey_1024.jsonl") as f:
        return {r["row"]: {k: r[k] for k in ("runs", "turns", "context_tokens")}
                for r in map(json.loads, f)}


@pytest.mark.slow
def test_the_originals_evaluation_client_against_serve_answers_as_our_eval(server, evaluated,
                                                                            monkeypatch):
    path, _, samples = evaluated
    with open(path) as f:
        items = json.load(f)
    model = resolve("memagent-tiny")
    limits = budgets(model)
    assert limits["max_final_tokens"] <= limits["max_memory_tokens"]
    ours = {row: sample["runs"][0]["pred"] for row, sample in samples.items()}

    tokenizer = AutoTokenizer.from_pretrained(model)   # as ruler_hqa.py loads it
    recurrent, original = _original_client(monkeypatch, server.port, limits["chunk_tokens"],
                                           limits["max_memory_tokens"])

    async def ask_all():
        return await asyncio.gather(*(
            recurrent.async_query_llm({**item, "_id": i}, "m", tokenizer, temperature=0.0,
                                      top_p=1.0) for i, item in enumerate(items)))

    theirs = {}
    for i, response in enumerate(asyncio.run(ask_all())):   # as ruler_hqa.py's get_pred
        assert response, f"item {i}: the request loop failed"
        pred, _ = original.extract_solution(response.strip())
        theirs[i] = (original.extract_boxed_answer(pred) if pred
                     else original.extract_boxed_answer(response))
    assert theirs == ours
    right = [ours[i] is not None and ours[i].strip() == item["answers"][0]
             for i, item in enumerate(items)]
    assert sum(right) >= 4, (ours, [item["answers"] for item in items])


@pytest.mark.slow
@pytest.mark.parametrize("method", [[], ["method=agent",
                                         "agent={module: memagent_jax.agents.memagent}"]])
def test_eval_through_model_url_answers_as_eval_here(server, evaluated, tmp_path, monkeypatch,
                                                     method):
    """MemAgent against serve, by its own method and as any agent is run (`method: agent`, its
    module named): every answer, reply, token count and turn count as the local engine's."""
    _, config, ours = evaluated
    monkeypatch.setenv("MEMAGENT_API_KEY", API_KEY)
    assert main(["eval", *config, *method, f"model.url={server.url}", "model.served_name=m",
                 f"output_dir={tmp_path}"]) == 0
    assert _samples(tmp_path) == ours


@pytest.mark.slow
def test_run_against_serve_reads_as_run_here(server, tmp_path, monkeypatch):
    monkeypatch.setenv("API_KEY", API_KEY)
    records = {"local": [], "url": []}
    for index in range(2):
        sample = synthetic.make_sample("multikey", 1500, FRESH_SEED, 100 + index)
        doc = tmp_path / f"doc{index}.txt"
        doc.write_text(sample.context)
        common = ["--doc", str(doc), "--question", sample.question, "--temperature", "0",
                  "--json"]
        for where, args in [("local", ["--model", "memagent-tiny"]),
                            ("url", ["--url", server.url, "--model", "m", "--tokenizer",
                                     "memagent-tiny"])]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):   # the server's logs keep the stderr
                assert main(["run", *args, *common]) == 0
            records[where].append(json.loads(out.getvalue()))
    for local, remote in zip(records["local"], records["url"]):
        assert local.keys() == remote.keys()
        assert len(local["turns"]) == 1500 // 256 + 2   # 256-token chunks, and the answer
        assert [t.keys() for t in local["turns"]] == [t.keys() for t in remote["turns"]]
        assert (local["memories"], local["answer"], local["final_reply"]) == (
            remote["memories"], remote["answer"], remote["final_reply"])
    assert sum(r["answer"].strip() == synthetic.make_sample(
        "multikey", 1500, FRESH_SEED, 100 + i).answer for i, r in enumerate(records["url"])) >= 1


@pytest.mark.slow
def test_run_against_serve_reads_a_document_of_every_word_as_run_here(server, tmp_path,
                                                                      monkeypatch, capsys):
    """Each chunk is sent as the document's own text: the ids decoded would read back as
    other words ("mona user" decodes as "monauser", which the server refuses)."""
    monkeypatch.setenv("API_KEY", API_KEY)
    assert main(["vocab", "--model", "memagent-tiny"]) == 0
    words = capsys.readouterr().out.split()
    assert {"user", "assistant", "}.", "\\boxed{"} <= set(words) and len(words) > 3900
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(words))
    records = []
    for args in (["--model", "memagent-tiny"],
                 ["--url", server.url, "--model", "m", "--tokenizer", "memagent-tiny"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):   # the server's logs keep the stderr
            assert main(["run", *args, "--doc", str(doc), "--question", "what is the code",
                         "--temperature", "0", "--max-memory-tokens", "8",
                         "--max-final-tokens", "8", "--json"]) == 0
        records.append(json.loads(out.getvalue()))
    local, remote = records
    assert len(local["turns"]) == len(words) // 256 + 2
    assert (local["memories"], local["final_reply"]) == (remote["memories"],
                                                         remote["final_reply"])
