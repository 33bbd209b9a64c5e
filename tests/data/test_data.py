"""Data builders: RULER-HQA and training sets from a hand-written HotpotQA fixture, RULER
synthetic tasks at token lengths, and the `data` command's bad input."""

import collections
import json
import os
import random
import re

import pytest

from memagent_jax.cli import main
from memagent_jax.data.hotpotqa import read_corpus, ruler_hqa_records
from memagent_jax.data.io import load_source, read_set
from memagent_jax.data.ruler import NIAH, TASKS, ruler_records
from memagent_jax.errors import UserError
from memagent_jax.tokenizer import load_tokenizer
from tests.builders import hotpot_rows
from tests.full_disk import fill_disk_after

PREFIX = "memagent-jax: error: "

def _documents(rows):
    return sorted({f"{t}\n{''.join(s)}" for r in rows for t, s in r["context"]})


def _split_context(context: str) -> list[str]:
    """Document texts of a context, checking the exact "Document i:" numbering."""
    parts = re.split(r"(?:^|\n\n)Document (\d+):\n", context)
    assert parts[0] == ""
    numbers, docs = parts[1::2], parts[2::2]
    assert numbers == [str(i) for i in range(1, len(docs) + 1)]
    return docs


@pytest.fixture
def hotpot_json(tmp_path):
    path = tmp_path / "hotpot_dev.json"
    path.write_text(json.dumps(hotpot_rows()))
    return str(path)


@pytest.fixture
def corpus(hotpot_json):
    return read_corpus(load_source(hotpot_json), hotpot_json)


def test_ruler_hqa_records_are_exact(corpus):
    rows = hotpot_rows()
    documents = _documents(rows)
    assert corpus.documents == documents  # 10 gold + 20 distinct distractors
    n = 14
    records = list(ruler_hqa_records(corpus, n, [0, 1, 2, 3, 4]))
    perm = list(range(n))
    random.Random(4).shuffle(perm)  # the original's fixed shuffle seed
    for record, row in zip(records, rows):
        assert set(record) == {"context", "input", "answers", "num_docs", "index"}
        assert record["input"] == row["question"] and record["answers"] == [row["answer"]]
        assert record["num_docs"] == n
        docs = _split_context(record["context"])
        assert record["context"] == "\n\n".join(f"Document {i + 1}:\n{d}"
                                                for i, d in enumerate(docs))
        assert len(docs) == n == len(set(docs)) and set(docs) <= set(documents)
        own = [f"{t}\n{''.join(s)}" for t, s in row["context"]]
        # own paragraph k sits where the fixed permutation sent position k
        for j, k in enumerate(perm):
            if k < len(own):
                assert docs[j] == own[k]
    gold_title = rows[2]["context"][1][0]
    assert f"{gold_title}\nThe Golden Gate strait was named in 1846" in records[2]["context"]


def test_ruler_hqa_is_deterministic_by_seed(corpus):
    a = list(ruler_hqa_records(corpus, 16, [0, 1, 2]))
    assert a == list(ruler_hqa_records(corpus, 16, [0, 1, 2]))
    b = list(ruler_hqa_records(corpus, 16, [0, 1, 2], seed=7))
    assert [r["context"] for r in a] != [r["context"] for r in b]
    # a sample does not depend on which other samples are built
    assert list(ruler_hqa_records(corpus, 16, [2]))[0] == a[2]
    # N = every document: all of them, whatever the seed
    every = list(ruler_hqa_records(corpus, len(corpus.documents), [1]))[0]
    assert sorted(_split_context(every["context"])) == corpus.documents


def test_hub_layout_parquet_gives_the_same_records(tmp_path, corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq
    hub = [{"id": r["_id"], "question": r["question"], "answer": r["answer"],
            "context": {"title": [t for t, _ in r["context"]],
                        "sentences": [s for _, s in r["context"]]}} for r in hotpot_rows()]
    path = str(tmp_path / "validation.parquet")
    pq.write_table(pa.Table.from_pylist(hub), path)
    hub_corpus = read_corpus(load_source(path), path)
    assert (list(ruler_hqa_records(hub_corpus, 12, [0, 4]))
            == list(ruler_hqa_records(corpus, 12, [0, 4])))


def test_data_ruler_hqa_command_writes_one_set_per_length(hotpot_json, tmp_path, capsys):
    out = tmp_path / "sets"
    assert main(["data", "ruler-hqa", "--source", hotpot_json, "--num-docs", "12", "20",
                 "--num-samples", "4", "--out", str(out)]) == 0
    small, large = read_set(str(out / "eval_12.json")), read_set(str(out / "eval_20.json"))
    assert [r["index"] for r in small] == [0, 1, 2, 3] == [r["index"] for r in large]
    assert [len(_split_context(r["context"])) for r in small + large] == [12] * 4 + [20] * 4
    corpus = read_corpus(load_source(hotpot_json), hotpot_json)
    assert small == list(ruler_hqa_records(corpus, 12, [0, 1, 2, 3]))
    # progress on a stderr that is no terminal (pytest's capture): one plain line per set
    progress = [line for line in capsys.readouterr().err.splitlines() if "docs:" in line]
    assert [line.split("|")[0] for line in progress] == ["12 docs: 100%", "20 docs: 100%"]


def test_data_ruler_hqa_indices_from_a_published_style_set(hotpot_json, tmp_path):
    from memagent_jax.data.io import write_parquet
    picks = str(tmp_path / "dev.parquet")
    write_parquet(picks, [{"extra_info": {"index": i, "num_docs": 200}} for i in (3, 1)])
    out = tmp_path / "sets"
    assert main(["data", "ruler-hqa", "--source", hotpot_json, "--num-docs", "12",
                 "--indices-from", picks, "--out", str(out)]) == 0
    assert [r["index"] for r in read_set(str(out / "eval_12.json"))] == [3, 1]


def test_data_hotpotqa_train_writes_the_published_parquet_layout(hotpot_json, tmp_path):
    import pyarrow.parquet as pq
    out = str(tmp_path / "train.parquet")
    assert main(["data", "hotpotqa-train", "--source", hotpot_json, "--num-docs", "14",
                 "--num-samples", "3", "--out", out]) == 0
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 3
    corpus = read_corpus(load_source(hotpot_json), hotpot_json)
    expected = list(ruler_hqa_records(corpus, 14, [0, 1, 2]))
    for row, record in zip(rows, expected):
        assert set(row) == {"data_source", "prompt", "context", "reward_model", "extra_info"}
        assert row["data_source"] == "hotpotqa"
        assert row["prompt"] == [{"role": "user", "content": record["input"]}]
        assert row["context"] == record["context"]
        assert row["reward_model"] == {"ground_truth": record["answers"]}
        assert row["extra_info"] == {"index": record["index"], "question": record["input"],
                                     "num_docs": 14}


def _error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith(PREFIX)
    return lines[-1]


def test_source_row_missing_a_field_names_row_and_field(tmp_path, capsys):
    rows = hotpot_rows()
    del rows[2]["answer"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rows))
    out = tmp_path / "sets"
    assert main(["data", "ruler-hqa", "--source", str(path), "--num-docs", "12",
                 "--out", str(out)]) == 2
    line = _error(capsys)
    assert "row 2" in line and "missing field 'answer'" in line
    assert not out.exists()


def test_length_the_documents_cannot_reach(hotpot_json, tmp_path, capsys):
    out = tmp_path / "sets"
    # 30 distinct documents in the fixture; 12 is fine, 31 is not: nothing is written
    assert main(["data", "ruler-hqa", "--source", hotpot_json, "--num-docs", "12", "31",
                 "--num-samples", "2", "--out", str(out)]) == 2
    line = _error(capsys)
    assert "31 documents per sample" in line and "only 30 distinct documents" in line
    assert not out.exists()


def test_missing_source_file(tmp_path, capsys):
    assert main(["data", "ruler-hqa", "--source", str(tmp_path / "nope.json"), "--num-docs",
                 "12", "--out", str(tmp_path / "o")]) == 2
    assert "nope.json: file not found" in _error(capsys)


def test_a_hub_id_goes_to_the_hub(tmp_path, capsys):
    """'owner/name' that is no local path is read from the hub (HF_HUB_OFFLINE here, as the
    tests set it: from the datasets cache, which lacks it: one line saying what to give
    instead); a path with directories or an extension is a missing file."""
    assert main(["data", "ruler-hqa", "--source", "hotpotqa/hotpot_qa", "--num-docs", "12",
                 "--out", str(tmp_path / "o")]) == 2
    line = _error(capsys)
    assert line.startswith(f"{PREFIX}hotpotqa/hotpot_qa: cannot load it from the datasets cache "
                           "(HF_HUB_OFFLINE is set): "), line
    assert line.endswith("; give a local .parquet, .json or .jsonl file (downloaded where there "
                         "is network) instead"), line
    assert main(["data", "ruler-hqa", "--source", "sub/dir/file", "--num-docs", "12", "--out",
                 str(tmp_path / "o")]) == 2
    assert "sub/dir/file: file not found" in _error(capsys)


@pytest.mark.parametrize("command, line", [
    (["data", "ruler-hqa", "--source", "hotpotqa/hotpot_qa", "--num-docs", "12", "--out", "{out}"],
     "hotpotqa/hotpot_qa"),
    (["train", "--config", "configs/train/tiny_cpu.yaml", "model.tokenizer=x",
      "data.train=[BytedTsinghua-SIA/hotpotqa]"], "data.train[0]: 'BytedTsinghua-SIA/hotpotqa'"),
])
def test_a_hub_source_fails_at_once_where_the_hub_is_out_of_reach(command, line, tmp_path,
                                                                 monkeypatch, capsys):
    """Without network (and HF_HUB_OFFLINE unset) a hub source is refused before `datasets`
    is asked (huggingface_hub would retry for some 25 s), saying what to give instead; the
    data command and the training data alike."""
    import datasets
    import huggingface_hub.constants

    def no_network(address, timeout):
        assert timeout <= 3
        raise OSError(-2, "Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("datasets was asked for a hub source the hub cannot give")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("socket.create_connection", no_network)
    monkeypatch.setattr(datasets, "load_dataset", never)
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert main([a.format(out=tmp_path / "o") for a in command]) == 2
    assert _error(capsys) == (
        f"{PREFIX}{line}: a Hugging Face hub dataset, and the hub is out of reach (no "
        "connection to huggingface.co: Name or service not known); give a local .parquet, "
        ".json or .jsonl file (downloaded where there is network) instead, or set "
        "HF_HUB_OFFLINE=1 to read it from the datasets cache")


# ---- RULER synthetic ----------------------------------------------------------------------

ESSAY = ("The best ideas often look like bad ideas at first. Startups grow by doing things "
         "that do not scale. A programmer who writes in a powerful language thinks differently. "
         "Most people are not lazy, they just have the wrong problems. Great work tends to come "
         "from curiosity rather than ambition. Cities send messages about what matters. "
         "Writing is a way of thinking, not just a way of recording thought. ")


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A small byte-level BPE tokenizer trained here (no download): any text encodes, and
    a token is neither a word nor a character, like Qwen's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [ESSAY, " ".join(["The grass is green. The sky is blue. The sun is yellow. "
                               "Here we go. There and back again."] * 3),
              "One of the special magic numbers for able-acorn is: 1234567. VAR ABCDE = 12345."]
    tok.train_from_iterator(corpus * 20, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("bpe")
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(str(path))
    return str(path)


def _tokens(tokenizer, text):
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _niah_answers_from_context(record) -> list[str]:
    """Reads the asked keys off the question and collects their values from the context."""
    spec = NIAH[record["task"]]
    query = re.match(rf"What are all the special magic {spec.value_type} for (.*) mentioned",
                     record["input"]).group(1)
    keys = [k.strip() for k in re.split(r", and |, ", query)]
    needle = re.compile(rf"One of the special magic {spec.value_type} for (\S+) is: (\S+)\.")
    found = collections.defaultdict(list)
    for key, value in needle.findall(record["context"]):
        found[key].append(value)
    return [v for k in keys for v in found[k]]


def _vt_answers_from_context(record) -> set[str]:
    value = re.search(r"assigned the value (\d+)", record["input"]).group(1)
    edges = dict(re.findall(r"VAR ([A-Z]{5}) = (?:VAR )?(\w+)\.", record["context"]))

    def resolves(name, seen=()):
        target = edges[name]
        return target == value or (target in edges and target not in seen
                                   and resolves(target, seen + (name,)))
    return {name for name in edges if resolves(name)}


@pytest.mark.parametrize("task", TASKS)
def test_ruler_task_lengths_and_needles(task, bpe_dir):
    tokenizer = load_tokenizer(bpe_dir)
    for length in (2000, 5000):
        records = list(ruler_records(task, length, 2, tokenizer, seed=1, haystack_text=ESSAY))
        for index, record in enumerate(records):
            assert record["task"] == task and record["length"] == length
            assert record["index"] == index
            tokens = _tokens(tokenizer, record["context"])
            assert tokens == record["tokens"] and abs(tokens - length) <= 0.05 * length
            answers = record["answers"]
            assert answers and all(a in record["context"] for a in answers)
            if task in NIAH:
                spec = NIAH[task]
                assert len(answers) == spec.queries * spec.values
                assert sorted(_niah_answers_from_context(record)) == sorted(answers)
            elif task == "vt":
                assert len(answers) == 5 and _vt_answers_from_context(record) == set(answers)
            else:
                counts = collections.Counter(w for w in record["context"].split() if w != "...")
                top = counts.most_common(4)
                assert {w for w, _ in top[:3]} == set(answers) and top[2][1] > top[3][1]
    again = list(ruler_records(task, 2000, 2, tokenizer, seed=1, haystack_text=ESSAY))
    assert again == list(ruler_records(task, 2000, 2, tokenizer, seed=1, haystack_text=ESSAY))
    other = list(ruler_records(task, 2000, 2, tokenizer, seed=2, haystack_text=ESSAY))
    assert [r["context"] for r in other] != [r["context"] for r in again]


def test_ruler_long_context_hits_the_length(bpe_dir):
    tokenizer = load_tokenizer(bpe_dir)
    (record,) = ruler_records("niah_multikey_2", 32768, 1, tokenizer, seed=3)
    assert abs(_tokens(tokenizer, record["context"]) - 32768) <= 0.05 * 32768
    assert sorted(_niah_answers_from_context(record)) == sorted(record["answers"])


def test_data_ruler_command(bpe_dir, tmp_path, capsys):
    essay = tmp_path / "essay.txt"
    essay.write_text(ESSAY)
    out = tmp_path / "ruler"
    assert main(["data", "ruler", "--tasks", "vt", "niah_single_2", "--lengths", "600",
                 "--tokenizer", bpe_dir, "--num-samples", "2", "--haystack", str(essay),
                 "--out", str(out)]) == 0
    records = read_set(str(out / "eval_niah_single_2_600.json"))
    assert len(records) == 2 and read_set(str(out / "eval_vt_600.json"))[0]["task"] == "vt"


@pytest.mark.parametrize("args,message", [
    (["--tasks", "niah_single_9"], "unknown task 'niah_single_9' (known: niah_single_1,"),
    (["--tasks", "niah_single_2"], "need an essay haystack"),
    (["--tasks", "niah_multikey_1"], "need an essay haystack"),
])
def test_data_ruler_bad_task(bpe_dir, tmp_path, capsys, args, message):
    assert main(["data", "ruler", *args, "--lengths", "600", "--tokenizer", bpe_dir,
                 "--out", str(tmp_path / "o")]) == 2
    assert message in _error(capsys)
    assert not (tmp_path / "o").exists()


def test_ruler_length_too_short(bpe_dir):
    tokenizer = load_tokenizer(bpe_dir)
    with pytest.raises(UserError, match="too short"):
        list(ruler_records("niah_multiquery", 40, 1, tokenizer, haystack_text=ESSAY))
    with pytest.raises(UserError, match="too short"):
        list(ruler_records("fwe", 30, 1, tokenizer))


def test_the_needle_task_is_a_data_command(tmp_path, capsys):
    assert main(["data", "needle", "--out", str(tmp_path / "needle"), "--train-size", "4",
                 "--val-size", "2"]) == 0
    assert sorted(os.listdir(tmp_path / "needle")) == ["tokenizer", "train.parquet",
                                                       "val.parquet"]


def test_the_needle_task_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys,
                                                                       monkeypatch):
    """The disk fills up in its last file (tests/full_disk.py): its parquet files, written
    first, are not left without the tokenizer; with space again the command writes them."""
    out = tmp_path / "needle"
    argv = ["data", "needle", "--out", str(out), "--train-size", "4", "--val-size", "2"]
    with monkeypatch.context() as patched:
        fill_disk_after(patched, tmp_path, 0)
        assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"memagent-jax: error: no space left on device writing {out}; nothing of it was kept "
        "(free some space and run the command again)\n")
    assert os.listdir(tmp_path) == []
    assert main(argv) == 0


def test_data_commands_never_overwrite_and_say_when_out_is_a_file(hotpot_json, tmp_path,
                                                                  capsys):
    out = tmp_path / "sets"
    argv = ["data", "ruler-hqa", "--source", hotpot_json, "--num-docs", "12", "--num-samples",
            "2", "--out", str(out)]
    assert main(argv) == 0
    assert main(argv) == 2  # as `data needle` and `export` refuse a used output
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"memagent-jax: error: --out: {out / 'eval_12.json'} exists; remove it or choose "
        "another --out")
    train = str(tmp_path / "train.parquet")
    assert main(["data", "hotpotqa-train", "--source", hotpot_json, "--num-samples", "2",
                 "--num-docs", "12", "--out", train]) == 0
    assert main(["data", "hotpotqa-train", "--source", hotpot_json, "--num-samples", "2",
                 "--num-docs", "12", "--out", train]) == 2
    assert f"--out: {train} exists" in capsys.readouterr().err
    assert main(["data", "needle", "--out", str(out / "eval_12.json" / "needle")]) == 2
    assert capsys.readouterr().err == (
        f"memagent-jax: error: --out: {out / 'eval_12.json' / 'needle'} cannot be made: "
        f"{out / 'eval_12.json'} is a file, not a directory\n")
