"""The synthetic long-document tasks (`memagent-jax data synthetic`): exact lengths in the
written tokenizer's tokens (transformers), facts anywhere from the first to the last token,
two-hop facts in different halves in both orders, the oracle memories, and files that
`memagent-jax eval` and the trainer read."""

import dataclasses
import glob
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from transformers import AutoTokenizer

from memagent_jax.cli import main
from memagent_jax.data.pipeline import ExampleSource, load_source
from memagent_jax.eval.sets import load_set
from memagent_jax.synthetic import tasks as synthetic
from tests.full_disk import fill_disk_after
from tests.synthetic.signals import ctrl_c_in_a_gc_callback


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from memagent_jax.data.needle import write_tokenizer
    path = write_tokenizer(str(tmp_path_factory.mktemp("tok")), synthetic.vocabulary())
    return AutoTokenizer.from_pretrained(path)


def _tokens(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("task", synthetic.TASKS)
@pytest.mark.parametrize("length", [synthetic.min_length("twohop"), 1000, 30_000])
def test_documents_are_exactly_as_long_as_asked_in_the_tokenizers_tokens(tokenizer, task,
                                                                         length):
    for index in range(3):
        sample = synthetic.make_sample(task, length, seed=1, index=index)
        ids = _tokens(tokenizer, sample.context)
        assert len(ids) == length and tokenizer.unk_token_id not in ids
        assert tokenizer.unk_token_id not in _tokens(tokenizer, sample.question)
        assert all(f.text in sample.context for f in sample.facts)
        assert [f.text for f in sample.facts] == sorted(
            (f.text for f in sample.facts), key=sample.context.index)  # document order


@pytest.mark.slow
def test_a_million_token_document(tokenizer):
    sample = synthetic.make_sample("multikey", 1 << 20, seed=0, index=0)
    assert len(_tokens(tokenizer, sample.context)) == 1 << 20
    assert len(set(sample.context.split())) > 2000  # text over the vocabulary, not one sentence


def test_the_vocabulary_is_a_few_thousand_disjoint_words():
    w = synthetic.words()
    classes = [w.nouns, w.verbs, w.adjectives, w.keys, w.people, w.cities, w.values]
    everything = [x for c in classes for x in c]
    assert len(everything) == len(set(everything)) > 3000
    assert synthetic.words() == w  # fixed: it defines the tokenizer


def test_the_tokenizer_keeps_the_committed_ids_and_reads_the_gate_sentences(tokenizer):
    """The tokenizer `data synthetic` writes has every id of the one the committed models were
    trained with (checkpoints/rl_only/start's, memagent-tiny's), the gates' words after them,
    all within the `small` preset's embedding rows, and reads both gates' sentences, which the
    committed one cannot."""
    from memagent_jax.agents.memagent.templates import GATE_SENTENCES, GATE_WORDS
    from memagent_jax.errors import UserError
    from memagent_jax.models.presets import preset_config
    from memagent_jax.tokenizer import PIECE_IDS, check_representable, load_tokenizer, rows_needed
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    committed = load_tokenizer(os.path.join(root, "checkpoints", "rl_only", "start"))
    old = {w: i for w, i in committed.get_vocab().items() if i < PIECE_IDS}
    new = {w: i for w, i in tokenizer.get_vocab().items() if i < PIECE_IDS}
    assert len(old) == 3969 and {w: new.get(w) for w in old} == old
    assert sorted(i for w, i in new.items() if w not in old) == list(range(3969, len(new)))
    assert rows_needed(tokenizer) == len(new) <= preset_config("small").vocab_size
    text = synthetic.make_sample("twohop", 300, 1, 0).context
    assert _tokens(tokenizer, text) == _tokens(committed, text)
    for gate in GATE_WORDS:
        check_representable(tokenizer, GATE_SENTENCES[gate], gate)
        with pytest.raises(UserError, match=gate):
            check_representable(committed, GATE_SENTENCES[gate], gate)


def test_facts_can_open_and_close_a_document():
    w = synthetic.words()
    facts = [synthetic.Fact(synthetic.CODE_FACT.format(w.keys[i], w.values[i]), "code", i == 0)
             for i in range(2)]
    sample = synthetic.document(random.Random(0), w, facts, [0.0, 1.0], 500, "q ?", "a")
    assert sample.context.startswith(facts[0].text) and sample.context.endswith(facts[1].text)
    assert len(sample.context.split()) == 500


def test_depths_cover_the_whole_document():
    """Over 200 samples the asked fact lands in the first and the last 5% of the document."""
    length = 4000
    where = []
    for index in range(200):
        sample = synthetic.make_sample("multikey", length, seed=3, index=index)
        fact = next(f for f in sample.facts if f.needed)
        where.append(sample.context.index(fact.text) / len(sample.context))
    assert min(where) < 0.05 and max(where) > 0.95


def test_two_hop_facts_lie_in_different_halves_in_either_order():
    orders = set()
    for index in range(40):
        sample = synthetic.make_sample("twohop", 3000, seed=0, index=index)
        needed = [f for f in sample.facts if f.needed]
        assert [f.kind for f in needed] in (["lives", "code"], ["code", "lives"])
        lives, code = sorted(needed, key=lambda f: f.kind != "lives")
        middle = len(sample.context) / 2
        positions = [sample.context.index(f.text) for f in needed]
        assert positions[0] < middle <= positions[1] + len(needed[1].text)
        person, city = lives.text.split()[-3:-1]
        assert lives.text == f"the city of {person} {city} ."
        assert code.text == f"the code of {city} {sample.answer} ."
        assert sample.question == f"what is the code of the city of {person} ?"
        orders.add(needed[0].kind)
    assert orders == {"lives", "code"}


def test_samples_are_deterministic_by_seed_and_index():
    a = synthetic.make_sample("twohop", 500, seed=4, index=2)
    assert a == synthetic.make_sample("twohop", 500, seed=4, index=2)
    assert a != synthetic.make_sample("twohop", 500, seed=5, index=2)
    assert a != synthetic.make_sample("twohop", 500, seed=4, index=3)


# sha256 of the JSON of make_sample(task, length, seed 1, index) for lengths 100 and 1000 and
# indices 0-4, as written at issue 74. Any change of a seed's documents (the filler, a fact's
# place, the words drawn) changes the sets and training rows every config names: change these
# only on purpose, and say so where the results it changes are recorded.
DOCUMENTS_SHA256 = {
    "multikey": "04607176be5105465697eaca085c1e63b95ad67626ce662f17837e6378e6a06d",
    "twohop": "1878b540eeea3ac3832ff9e3c1531cbab8448a8484479d002631c37f9f086bd7"}


@pytest.mark.parametrize("task", synthetic.TASKS)
def test_a_seeds_documents_are_the_ones_it_always_gave(task):
    samples = [dataclasses.asdict(synthetic.make_sample(task, length, 1, index))
               for length in (100, 1000) for index in range(5)]
    assert hashlib.sha256(json.dumps(samples).encode()).hexdigest() == DOCUMENTS_SHA256[task]


def test_oracle_memories_keep_what_bears_on_the_question():
    facts = [{"text": "the code of ka is x .", "kind": "code", "needed": False},
             {"text": "the code of bo is y .", "kind": "code", "needed": True},
             {"text": "mu lives in bo .", "kind": "lives", "needed": True}]
    chunks = ["a b the code of ka is x", ". c the code of bo is y . d", "e mu lives in bo .",
              "f"]
    # Before the person's city is known every city's code may matter; after, only its own.
    assert synthetic.oracle_memories(chunks, facts) == [
        "", "the code of ka is x .\nthe code of bo is y .",
        "the code of bo is y .\nmu lives in bo .", "the code of bo is y .\nmu lives in bo ."]
    multikey = [dict(f, kind="code") for f in facts[:2]]
    assert synthetic.oracle_memories(chunks[:2], multikey) == ["", "the code of bo is y ."]


def test_the_cli_writes_sets_eval_reads_and_rows_the_trainer_reads(tmp_path, capsys):
    out = tmp_path / "synthetic"
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "512", "8192",
                 "--num-samples", "3", "--seed", "7", "--out", str(out)]) == 0
    eval_set = load_set(str(out / "eval_multikey_8192.json"))
    assert (eval_set.label, eval_set.nominal_tokens, len(eval_set.records)) == ("8K", 8192, 3)
    assert eval_set.score(eval_set.records[0]["answers"][0], eval_set.records[0]["answers"])[
        "accuracy"] == 1.0
    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert len(_tokens(tokenizer, eval_set.records[1]["context"])) == 8192

    assert main(["data", "synthetic", "--task", "twohop", "--lengths", "300", "600",
                 "--num-samples", "2", "--layout", "train", "--out", str(out)]) == 0
    source = ExampleSource(load_source(str(out / "train_twohop.parquet")))
    assert len(source) == 4
    example = source[3]
    assert example.question.startswith("what is the code of the city of")
    assert example.context == synthetic.make_sample("twohop", 600, 0, 1).context
    with open(out / "eval_multikey_512.json") as f:
        assert json.load(f)[0]["synthetic_task"] == "multikey"


@pytest.mark.parametrize("task", synthetic.TASKS)
def test_fact_at_chunk_end_puts_the_answers_last_fact_in_a_chunks_last_tokens(tmp_path, task):
    """Read as the agent reads (transformers' tokenizer, `chunk_ids`): the last needed fact is
    whole in one chunk, not the first, and ends in its last 10 tokens; nothing else changes."""
    from memagent_jax.agents.memagent.reading import chunk_ids
    out = tmp_path / "late"
    assert main(["data", "synthetic", "--task", task, "--lengths", "1024", "2048",
                 "--num-samples", "40", "--seed", "3", "--layout", "train",
                 "--fact-at-chunk-end", "10", "--out", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    rows = load_source(str(out / f"train_{task}.parquet"))
    tails, chunk_indices = set(), set()
    for row in rows:
        info = row["extra_info"]
        plain = synthetic.make_sample(task, info["length"], 3, info["index"])
        assert sorted(row["context"].split()) == sorted(plain.context.split())
        assert row["prompt"][0]["content"] == plain.question
        facts = [f["text"] for f in info["facts"]]
        assert sorted(facts) == sorted(f.text for f in plain.facts)
        assert facts == sorted(facts, key=row["context"].index)  # still in document order
        last = [f["text"] for f in info["facts"] if f["needed"]][-1]
        fact = _tokens(tokenizer, last)
        chunks = chunk_ids(_tokens(tokenizer, row["context"]), 256)
        where = [(c, i) for c, chunk in enumerate(chunks) for i in range(len(chunk))
                 if chunk[i:i + len(fact)] == fact]
        assert len(where) == 1 and where[0][0] >= 1
        ids = _tokens(tokenizer, plain.context)
        before = next(i for i in range(len(ids)) if ids[i:i + len(fact)] == fact) // 256
        assert where[0][0] == before or before == 0  # moved within its chunk unless the first
        tail = 256 - (where[0][1] + len(fact))  # tokens after the fact's full stop
        assert 0 <= tail < 10
        tails.add(tail)
        chunk_indices.add(where[0][0])
    assert len(tails) >= 8 and len(chunk_indices) >= 6


@pytest.mark.parametrize("argv, message", [
    (["--task", "needles", "--lengths", "100"], "unknown synthetic task 'needles'"),
    (["--task", "multikey", "--lengths", "1000", "--fact-at-chunk-end", "10"],
     "--fact-at-chunk-end: a document of 1000 tokens is not two or more whole chunks of 256"),
    (["--task", "multikey", "--lengths", "512", "--fact-at-chunk-end", "9"],
     "--fact-at-chunk-end 9: the window must be 10 tokens"),
    (["--task", "multikey", "--lengths", "512", "--fact-at-chunk-end", "129"],
     "to 128 (half a chunk"),
    (["--task", "multikey", "--lengths", "512", "--fact-at-chunk-end", "10", "--chunk-tokens",
      "0"], "--chunk-tokens must be positive, got 0"),
    (["--task", "multikey", "--lengths", "0"], "--lengths 0: a multikey document needs at"),
    (["--task", "twohop", "--lengths", "100", "--num-samples", "0"], "--num-samples must be"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    assert main(["data", "synthetic", *argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "x").exists()


def test_a_length_that_is_not_a_number_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["data", "synthetic", "--task", "twohop", "--lengths", "8X", "--out",
              str(tmp_path)])
    assert exit_.value.code == 2
    assert "argument --lengths: expected a number of tokens" in capsys.readouterr().err


def test_lengths_count_k_as_the_eval_does_and_no_set_is_overwritten(tmp_path, capsys):
    out = tmp_path / "sets"
    argv = ["data", "synthetic", "--task", "multikey", "--lengths", "1K", "--num-samples", "1",
            "--out", str(out)]
    assert main(argv) == 0
    assert load_set(str(out / "eval_multikey_1024.json")).label == "1K"
    before = (out / "eval_multikey_1024.json").read_text()
    assert main([*argv[:-2], "--seed", "5", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"memagent-jax: error: --out: {out / 'eval_multikey_1024.json'} exists; remove it or "
        "choose another --out")
    assert (out / "eval_multikey_1024.json").read_text() == before


@pytest.mark.parametrize("room, writing", [(0, "tokenizer"), (2000, "eval_multikey_1024.json")])
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing_partial(
        tmp_path, capsys, monkeypatch, room, writing):
    """The disk fills up (tests/full_disk.py) in the tokenizer's files, or in the set's after
    the tokenizer is complete: one line naming what was being written, none of it left; the
    same command finishes once there is space."""
    out = tmp_path / "sets"
    argv = ["data", "synthetic", "--task", "multikey", "--lengths", "1K", "--num-samples", "2",
            "--out", str(out)]
    with monkeypatch.context() as patched:
        fill_disk_after(patched, tmp_path, room)
        assert main(argv) == 2
    path = out / writing if writing != "tokenizer" else os.path.abspath(out / writing)
    kept = ("nothing of it was kept" if writing == "tokenizer" else "it was not written")
    assert capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1] == (
        f"memagent-jax: error: no space left on device writing {path}; {kept} (free some "
        "space and run the command again)")
    assert sorted(os.listdir(out)) == ([] if writing == "tokenizer" else ["tokenizer"])
    assert main(argv) == 0
    assert len(load_set(str(out / "eval_multikey_1024.json")).records) == 2


@pytest.mark.parametrize("kind", ["a file", "under a file"])
def test_an_out_directory_that_is_a_file_is_one_line(tmp_path, capsys, kind):
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" if kind == "a file" else tmp_path / "f" / "sets"
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "512", "--out",
                 str(out)]) == 2
    problem = "" if kind == "a file" else f"cannot be made: {tmp_path / 'f'} "
    assert capsys.readouterr().err == (f"memagent-jax: error: --out: {out} {problem}is a file, "
                                       "not a directory\n")


def test_ctrl_c_stops_the_build_even_where_python_drops_it_and_writes_nothing(
        tmp_path, monkeypatch, capsys):
    """A Ctrl-C that Python alone drops (tests/synthetic/signals.py) stops the command with
    one line and status 130; the set being written is not left behind, in part or as .tmp."""
    ctrl_c_in_a_gc_callback(monkeypatch, call=3)  # the second set's first document
    out = tmp_path / "sets"
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "512", "1K",
                 "--num-samples", "2", "--out", str(out)]) == 130
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    assert err[-1] == (f"memagent-jax: interrupted (Ctrl-C); {out / 'eval_multikey_1024.json'} "
                       f"was not written ({out / 'eval_multikey_512.json'} complete)")
    assert sorted(os.listdir(out)) == ["eval_multikey_512.json", "tokenizer"]
    assert len(load_set(str(out / "eval_multikey_512.json")).records) == 2


def test_sigterm_stops_the_build_and_leaves_no_temporary_file(tmp_path):
    """SIGTERM (a scheduler's stop) kills at once by default, past every clean-up: here it
    stops the work as Ctrl-C does, and the set being written is removed."""
    out = tmp_path / "sets"
    command = subprocess.Popen(
        [sys.executable, "-m", "memagent_jax.cli", "data", "synthetic", "--task", "multikey",
         "--lengths", "32M", "--num-samples", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not glob.glob(str(out / "*.tmp*")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the set's temporary file opens as its first document starts
            # (10 s to build)
        assert glob.glob(str(out / "*.tmp*")), command.communicate(timeout=1)
        signalled = time.monotonic()
        command.send_signal(signal.SIGTERM)
        _, err = command.communicate(timeout=20)
        stopped_in = time.monotonic() - signalled
    finally:
        command.kill()
    assert command.returncode == 143, err  # 128 + SIGTERM, as a scheduler expects
    assert err.replace("\r", "\n").strip().splitlines()[-1] == (
        f"memagent-jax: stopped (SIGTERM); {out / 'eval_multikey_33554432.json'} was not "
        "written")
    assert sorted(os.listdir(out)) == ["tokenizer"]
    assert stopped_in < 5


def test_a_set_that_cannot_fit_in_memory_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                     capsys):
    """Measured bytes a token (synthetic.command) against the memory available: one line
    naming the flags and the figures, and nothing written."""
    monkeypatch.setattr(synthetic, "available_memory", lambda: 2 ** 30)
    out = tmp_path / "x"
    for argv, message in [
        (["--lengths", "1K", "64M"], "--lengths 67108864: a document of 67,108,864 tokens "
                                     "takes about 18 bytes a token to build: about 1.1 GiB of "
                                     "memory, and this machine has 1.0 GiB available"),
        (["--lengths", "1K", "16M", "--fact-at-chunk-end", "10"],
         "--lengths 16777216: a document of 16,777,216 tokens takes about 90 bytes a token"),
        (["--lengths", "64", "4096", "--num-samples", "6000", "--layout", "train"],
         "--lengths 64 4096 with --num-samples 6000: --layout train keeps every row "
         "(24,960,000 tokens, about 45 bytes a token) until the parquet file is written"),
    ]:
        assert main(["data", "synthetic", "--task", "multikey", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"memagent-jax: error: {message}"), err
    assert not out.exists()
    assert main(["data", "synthetic", "--task", "multikey", "--lengths", "1K", "--num-samples",
                 "1", "--out", str(out)]) == 0  # what fits is built


def test_available_memory_is_what_the_system_reports():
    psutil = pytest.importorskip("psutil")
    if not os.path.exists("/proc/meminfo"):
        assert synthetic.available_memory() is None
        return
    assert synthetic.available_memory() == pytest.approx(psutil.virtual_memory().available,
                                                         rel=0.1)
