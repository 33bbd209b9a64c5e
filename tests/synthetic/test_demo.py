"""`memagent-jax demo` and models addressed by name (`memagent_jax.pretrained`): a model
directory shipped in the package resolves by its name for `run`, `export` and `demo`, its
recorded budgets (`memagent.json`) are the memory loop's unless flags say otherwise; the demo
reads a fresh synthetic document and prints the memory's changes, answer and truth; the trace
follows each needed fact through the memories (hand-made ones, and a real read's), or with
--selection checks each memory for every fact; bad input is one line. The model is a random
`small` preset over the synthetic tokenizer (what it answers is not the point here;
docs/synthetic.md trains one)."""

import json
import os
import shlex

import pytest

from memagent_jax import model_dir
from memagent_jax.cli import main
from memagent_jax.data.needle import write_tokenizer
from memagent_jax.models.loading import random_model, save_hf
from memagent_jax.models.presets import preset_config
from memagent_jax.synthetic import demo, trace
from memagent_jax.synthetic import tasks as synthetic
from memagent_jax.synthetic.trace import (
    AGE_BINS,
    OUTCOMES,
    FactTrace,
    follow,
    losses_by_age,
    made_up,
    trace_document,
)
from tests.hf_reference import write_hf_model, write_tiny_tokenizer
from tests.synthetic.signals import ctrl_c_in_a_gc_callback

pytestmark = pytest.mark.slow  # `demo` and `trace` reading documents

BUDGETS = {"chunk_tokens": 128, "max_memory_tokens": 12, "max_final_tokens": 6,
           "max_problem_tokens": 16}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A package directory holding one model, `tiny-agent`, as a shipped model is laid out."""
    root = tmp_path_factory.mktemp("pretrained")
    tokenizer = write_tokenizer(str(tmp_path_factory.mktemp("tok")), synthetic.vocabulary())
    config = preset_config("small", dtype="float32")
    save_hf(random_model(config, seed=0), config, str(root / "tiny-agent"),
            tokenizer_dir=tokenizer)
    (root / "tiny-agent" / model_dir.BUDGETS_FILE).write_text(json.dumps(BUDGETS))
    return root


@pytest.fixture
def in_package(shipped, monkeypatch, tmp_path):
    monkeypatch.setattr(model_dir, "SHIPPED_ROOT", str(shipped))
    monkeypatch.chdir(tmp_path)  # no directory of that name here
    return "tiny-agent"


def test_a_shipped_model_resolves_by_name_and_a_directory_on_disk_comes_first(in_package,
                                                                              tmp_path):
    assert model_dir.shipped_names() == ["tiny-agent"]
    assert model_dir.resolve("tiny-agent") == os.path.join(model_dir.SHIPPED_ROOT, "tiny-agent")
    assert model_dir.resolve("elsewhere/model") == "elsewhere/model"
    assert model_dir.budgets(model_dir.resolve("tiny-agent"), chunk_tokens=64) == {
        **BUDGETS, "chunk_tokens": 64}
    (tmp_path / "tiny-agent").mkdir()
    assert model_dir.resolve("tiny-agent") == "tiny-agent"


def test_export_and_run_take_the_name_and_run_its_budgets(in_package, tmp_path, capsys):
    assert main(["export", "--model", in_package, "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / model_dir.BUDGETS_FILE).read_text()) == BUDGETS
    sample = synthetic.make_sample("multikey", 300, 5, 0)
    (tmp_path / "doc.txt").write_text(sample.context)
    capsys.readouterr()
    assert main(["run", "--model", in_package, "--doc", str(tmp_path / "doc.txt"),
                 "--question", sample.question, "--temperature", "0", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    # 300 tokens in chunks of 128 (the model's budget, not run's default of 5000): 3 updates
    updates = [t for t in record["turns"] if t["kind"] == "update"]
    assert len(updates) == 3
    assert all(t["response_tokens"] <= BUDGETS["max_memory_tokens"] for t in updates)


def test_convert_and_export_take_the_name_or_the_directory_with_its_side_files(
        in_package, tmp_path):
    """convert carries a shipped model's tokenizer, chat template and budgets into the
    checkpoint, as it does an HF directory's; export takes the shipped directory by its path
    as by its name."""
    shipped = os.path.join(model_dir.SHIPPED_ROOT, in_package)
    side_files = sorted(n for n in os.listdir(shipped) if n.endswith((".jinja", ".json"))
                        and n != "config.json")
    assert {"tokenizer.json", "chat_template.jinja", model_dir.BUDGETS_FILE} <= set(side_files)
    assert main(["convert", "--model", in_package, "--out", str(tmp_path / "ckpt")]) == 0
    assert sorted(os.listdir(tmp_path / "ckpt" / model_dir.SIDE_DIR)) == side_files
    assert main(["export", "--model", shipped, "--out", str(tmp_path / "hf")]) == 0
    assert set(side_files) <= set(os.listdir(tmp_path / "hf"))


def test_demo_reads_a_fresh_document_and_shows_the_memory_answer_and_truth(in_package,
                                                                          capsys):
    assert main(["demo", "--model", in_package, "--length", "1K", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    document = synthetic.make_sample("multikey", 1024, 7, 0)  # K = 1024, as the eval counts
    assert f"question: {document.question}" in out
    assert f"truth: {document.answer}" in out and "answer:" in out
    assert "memory, at the turns where it changed:" in out and "after chunk     1:" in out
    needed = [f for f in document.facts if f.needed][0]
    chunk = (document.context.split().index(needed.text.split()[3]) - 3) // 128 + 1
    assert f"fact in chunk {chunk:>5}: {needed.text}   <- needed" in out
    assert "(wrong;" in out or "(correct;" in out


@pytest.mark.parametrize("outcome, turn, later", [
    ("kept", 3, "held the true value from then on"),
    ("late", 5, "held the true value from chunk 6 on"),
    ("unwritten", None, "never held the true value"),
    ("lost", 6, "held the true value, then lost it after chunk 7"),
])
def test_demo_says_when_a_memory_held_a_made_up_value_before_its_fact(outcome, turn, later):
    memories = ["No previous memory", "the code of kasumo vigifa.", "", FACT, FACT, FACT, ""]
    fact = FactTrace(FACT, chunk=2, word=40, due=3, outcome=outcome, turn=turn, memory="",
                     made_up=1)
    assert trace.made_up_line(fact, memories) == (
        "note: from chunk 2 the memory held a made-up value for 'the code of kasumo' (vigifa), "
        f"2 chunks before its fact was read (chunk 3); after reading it, the memory {later}")
    none = FactTrace(FACT, chunk=2, word=40, due=3, outcome=outcome, turn=turn, memory="",
                     made_up=None)
    assert trace.made_up_line(none, memories) is None
    cut = ["No previous memory", "the code of kasumo", "", FACT, FACT, FACT, ""]  # at its cap
    assert trace.made_up_line(fact, cut).startswith(
        "note: from chunk 2 the memory held a made-up value for 'the code of kasumo' (nothing),")


def test_demo_checks_every_needed_fact_of_its_read_for_a_made_up_value(in_package, capsys,
                                                                         monkeypatch):
    seen, real = [], trace.made_up_line

    def recording(fact, memories):
        seen.append((fact, list(memories)))
        return real(fact, memories)

    monkeypatch.setattr(trace, "made_up_line", recording)
    assert main(["demo", "--model", in_package, "--length", "1K", "--seed", "7",
                 "--task", "twohop"]) == 0
    out = capsys.readouterr().out
    document = synthetic.make_sample("twohop", 1024, 7, 0)
    assert [f.text for f, _ in seen] == [f.text for f in document.facts if f.needed]
    for fact, memories in seen:
        assert len(memories) == 1024 // 128  # one a chunk
        assert (fact.made_up is not None) == (real(fact, memories) in out.splitlines())


def test_demo_prints_its_seed_and_the_command_that_repeats_it(in_package, capsys):
    assert main(["demo", "--model", in_package, "--length", "1K"]) == 0  # a random seed
    first = capsys.readouterr().out.splitlines()
    (line,) = [x for x in first if x.startswith("the same run again: ")]
    argv = shlex.split(line.removeprefix("the same run again: "))
    assert argv[:2] == ["memagent-jax", "demo"] and "--seed" in argv
    assert f"(seed {argv[argv.index('--seed') + 1]})" in first[0]
    assert main(argv[1:]) == 0
    again = capsys.readouterr().out.splitlines()
    # all but the timing at the end of the answer's line
    assert again[:-1] == first[:-1] and again[-1].split("(")[0] == first[-1].split("(")[0]


def test_a_model_of_another_vocabulary_is_refused_before_reading(tmp_path, capsys):
    model = write_hf_model(tmp_path / "other", seed=1)
    write_tiny_tokenizer(model)
    capsys.readouterr()
    assert main(["demo", "--model", model, "--length", "8K"]) == 2  # past the default chunk
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"memagent-jax: error: --model {model} (the synthetic documents' words): the tokenizer "
        "has no token for 'near', 'by', 'code', 'city', 'gigi' and 3899 more (the model "
        "would read [UNK] in their place; `memagent-jax vocab --model MODEL` lists the words a "
        "model reads)"), err


@pytest.mark.parametrize("argv, message", [
    (["--length", "100"], "--length 100: below one chunk of 128 tokens"),
    (["--length", "0"], "--length 0: below one chunk"),
    (["--task", "needles"], "unknown synthetic task 'needles' (known: multikey, twohop)"),
    (["--length", "1K", "--chunk-tokens", "100000"], "--chunk-tokens 100000: more than the "
     "document's --length 1024; give a --chunk-tokens of at most 1024 (or a longer --length)"),
    (["--length", "1K", "--show", "-3"], "--show must be 0 or more (memory changes to print), "
                                         "got -3"),
])
def test_demo_bad_input_is_one_line(in_package, capsys, argv, message):
    assert main(["demo", "--model", in_package, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memagent-jax: error: " + message), err


def test_a_document_that_cannot_fit_in_memory_is_refused_before_the_model_loads(
        in_package, monkeypatch, capsys):
    monkeypatch.setattr(synthetic, "available_memory", lambda: 2 ** 30)
    monkeypatch.setattr(demo, "load_agent", None)  # never reached
    assert main(["demo", "--model", in_package, "--length", "2M"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "memagent-jax: error: --length 2097152: a document of 2,097,152 tokens takes about 700 "
        "bytes a token to read (the tokenizer's, mostly): about 1.4 GiB of memory, and this "
        "machine has 1.0 GiB available"]


def test_ctrl_c_stops_the_demo_even_where_python_drops_it(in_package, monkeypatch, capsys):
    """A Ctrl-C that Python alone drops (tests/synthetic/signals.py) stops the demo at its next
    poll (here: the document read, before the first turn): one line, status 130."""
    ctrl_c_in_a_gc_callback(monkeypatch)
    assert main(["demo", "--model", in_package, "--length", "1K", "--seed", "7"]) == 130
    captured = capsys.readouterr()
    assert "answer:" not in captured.out
    assert captured.err.replace("\r", "\n").strip().splitlines()[-1] == (
        "memagent-jax: interrupted (Ctrl-C)")


def test_demo_without_a_model_says_which_are_shipped(in_package, capsys):
    assert main(["demo", "--model", "no-such-model"]) == 2
    assert capsys.readouterr().err.strip() == (
        "memagent-jax: error: --model no-such-model: neither a model directory nor a shipped "
        "model (shipped: tiny-agent)")


FACT = "the code of kasumo bedila ."


@pytest.mark.parametrize("memories, due, expected", [
    (["", FACT, "the code of kasumo bedila."], 1, ("kept", 1)),   # a decoder's joined stop
    (["", "", FACT, FACT], 1, ("late", 2)),
    (["", "the code of kasumo vigifa .", "the code of kasumo bedilaro ."], 1,
     ("unwritten", None)),                                         # another value; a longer word
    ([FACT, "", ""], 1, ("unwritten", None)),                      # held only before it was due
    (["", FACT + "\nthe code of lira vuto .", "the code of bedila kasumo ."], 1, ("lost", 2)),
])
def test_trace_follows_a_fact_through_the_memories(memories, due, expected):
    assert follow(memories, FACT, due) == expected


@pytest.mark.parametrize("memories, due, expected", [
    (["No previous memory", "", FACT], 2, None),
    (["No previous memory", "the code of kasumo vigifa .", FACT], 2, 1),   # made up after 2
    (["the code of kasumo bedila.", FACT], 1, 0),                 # the right value, unread
    (["the code of lira bedila .", "the city of kasumo vuto ."], 2, None),  # other subjects
    ([FACT, "the code of kasumo vigifa ."], 0, None),             # after its chunk: a rewrite
])
def test_trace_finds_a_value_made_up_before_its_fact_was_read(memories, due, expected):
    assert made_up(memories, FACT, due) == expected


@pytest.mark.parametrize("memories, due, expected", [
    ([FACT, FACT, FACT], 0, (2, 0)),
    (["", FACT, "", FACT, FACT, ""], 1, (3, 2)),        # every loss counted, not the first
    (["the code of kasumo vigifa .", FACT, ""], 1, (1, 1)),  # before `due`: not counted
    (["", "", ""], 0, (0, 0)),
])
def test_trace_counts_every_turn_that_loses_a_held_fact(memories, due, expected):
    carried, dropped = losses_by_age(memories, FACT, due)
    assert (sum(carried), sum(dropped)) == expected


def test_trace_bins_the_carried_turns_by_the_turns_since_the_fact_was_first_written():
    """Written after turn 2 (due 1, so one turn late), held 20 turns, lost, rewritten, held to
    the end: ages count from the first write, and a loss falls in its age's bin."""
    memories = ["", "", FACT] + [FACT] * 20 + ["", FACT, FACT]
    carried, dropped = losses_by_age(memories, FACT, 1)
    assert len(carried) == len(dropped) == len(AGE_BINS)
    # pairs from the first write (turn 2): ages 1..20 held -> held or lost; age 21 is the
    # loss at turn 22 -> 23; turns 24, 25 held again at ages 22, 23 (24 has a next turn).
    assert carried == [3, 12, 7, 0, 0, 0, 0] and dropped == [0, 0, 1, 0, 0, 0, 0]


def test_trace_expects_a_fact_cut_by_the_chunk_boundary_one_turn_later():
    chunk = 64
    index, document = next(
        (i, d) for i in range(500) for d in [synthetic.make_sample("multikey", 256, 1, i)]
        if (d.context.split().index(_needed(d).split()[3]) - 3) % chunk in (chunk - 3, chunk - 2))
    words = document.context.split()
    start = words.index(_needed(document).split()[3]) - 3
    texts = [" ".join(words[i:i + chunk]) for i in range(0, len(words), chunk)]
    memories = [""] * len(texts)
    for turn in range(start // chunk + 1, len(texts)):  # written when the fact is whole
        memories[turn] = _needed(document)
    trace = trace_document(index, document, texts, memories, document.answer, chunk)
    (fact,) = trace.facts
    assert (fact.chunk, fact.word, fact.due) == (start // chunk, start % chunk, start // chunk + 1)
    assert (fact.outcome, fact.turn, trace.correct, trace.outcome) == ("kept", fact.due, True, None)


def _needed(document):
    return next(f.text for f in document.facts if f.needed)


def test_trace_reads_documents_and_prints_a_line_each_and_the_outcomes(in_package, capsys,
                                                                        tmp_path):
    out = tmp_path / "traces.jsonl"
    assert main(["trace", "--model", in_package, "--length", "1K", "--num-samples", "3",
                 "--seed", "7", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0].startswith("3 multikey documents of 1,024 tokens (seed 7)")
    assert len(records) == 3 and [r["index"] for r in records] == [0, 1, 2]
    for record, line in zip(records, lines[1:4]):
        document = synthetic.make_sample("multikey", 1024, 7, record["index"])
        (fact,) = record["facts"]
        start = document.context.split().index(fact["text"].split()[3]) - 3
        assert fact["text"] == _needed(document) and record["truth"] == document.answer
        assert (fact["chunk"], fact["word"]) == divmod(start, BUDGETS["chunk_tokens"])
        assert line.split()[:3] == [str(record["index"]),
                                    "right" if record["correct"] else "WRONG",
                                    fact["outcome"] + ("" if fact["outcome"] == "kept" else
                                                       ":" if fact["turn"] is None else "")]
    counts = {o: sum(r["facts"][0]["outcome"] == o for r in records) for o in OUTCOMES}
    right = sum(r["correct"] for r in records)
    assert lines[4] == (", ".join(f"{o} {n}" for o, n in counts.items())
                        + f"; answers right {right} of 3")
    invented = [r for r in records if r["facts"][0]["made_up"] is not None]
    assert lines[5] == (f"a value made up before its fact was read: {len(invented)} of 3 "
                        f"documents, {sum(not r['correct'] for r in invented)} of them "
                        "answered wrong")
    written = sum(r["facts"][0]["outcome"] != "unwritten" for r in records)
    assert lines[6].startswith(f"needed facts written: {written} of 3")
    carried = sum(sum(r["facts"][0]["carried"]) for r in records)
    dropped = sum(sum(r["facts"][0]["dropped"]) for r in records)
    assert lines[7].startswith(f"a held fact lost in {dropped} of {carried} turns")


def test_trace_selection_checks_each_memory_for_every_fact(in_package, capsys, tmp_path):
    out = tmp_path / "selection.jsonl"
    assert main(["trace", "--selection", "--model", in_package, "--length", "256",
                 "--num-samples", "3", "--seed", "7", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0].startswith("3 multikey documents of 256 tokens (seed 7), read 128 tokens")
    assert lines[1].startswith("memories holding an asked fact: ") and len(lines) == 6
    assert [r["index"] for r in records] == [0, 1, 2]
    for record in records:
        document = synthetic.make_sample("multikey", 256, 7, record["index"])
        assert record["truth"] == document.answer
        assert len(record["asked"]) == 1 and len(record["distractors"]) == 3
        assert record["correct"] == (record["answer"] == document.answer)
    assert main(["trace", "--selection", "--carries", "--model", in_package]) == 2
    assert "give one" in capsys.readouterr().err


def test_trace_refuses_an_existing_out_before_reading(in_package, capsys, tmp_path):
    (tmp_path / "t.jsonl").write_text("kept")
    assert main(["trace", "--model", in_package, "--out", "t.jsonl"]) == 2
    assert capsys.readouterr() == ("", "memagent-jax: error: --out: t.jsonl exists; remove it "
                                       "or choose another --out\n")
    assert (tmp_path / "t.jsonl").read_text() == "kept"


@pytest.mark.parametrize("argv, message", [
    (["--num-samples", "0"], "--num-samples must be at least 1, got 0"),
    (["--length", "10"], "--length 10: below one chunk of 128 tokens"),
    (["--task", "needles"], "unknown synthetic task 'needles'"),
    (["--out", "no/such/dir/t.jsonl"], "no/such/dir/t.jsonl: its directory"),
])
def test_trace_bad_input_is_one_line(in_package, capsys, argv, message):
    assert main(["trace", "--model", in_package, "--length", "1K", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memagent-jax: error: " + message), err
