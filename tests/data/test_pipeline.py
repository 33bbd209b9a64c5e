"""The training input pipeline (data/pipeline.py): the hotpotqa layout, shuffling by seed, a
resumable position, and rows that do not fit the layout."""

import json

import pytest

from memagent_jax.data import pipeline
from memagent_jax.data.needle import needle_rows, write_rows
from memagent_jax.errors import UserError


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = write_rows(needle_rows(10, seed=1), str(tmp_path_factory.mktemp("p") / "t.parquet"))
    return pipeline.load_source(path)


def test_rows_become_examples(dataset):
    example = pipeline.ExampleSource(dataset)[3]
    row = needle_rows(10, seed=1)[3]
    assert example.index == 3 and example.data_source == "needle"
    assert example.question == row["prompt"][0]["content"]
    assert example.context == row["context"]
    assert example.ground_truths == tuple(row["reward_model"]["ground_truth"])
    assert example.extra_info["index"] == 3


def test_shuffled_by_seed_with_a_new_order_each_epoch(dataset):
    first = [e.index for e in pipeline.take(pipeline.training_iterator(dataset, 0), 20)]
    again = [e.index for e in pipeline.take(pipeline.training_iterator(dataset, 0), 20)]
    other = [e.index for e in pipeline.take(pipeline.training_iterator(dataset, 1), 20)]
    assert first == again and first != other
    assert sorted(first[:10]) == sorted(first[10:]) == list(range(10))
    assert first[:10] != first[10:]


def test_unshuffled_reads_in_file_order(dataset):
    """data.shuffle false, the published scripts' setting: rows in order, epoch after epoch."""
    iterator = pipeline.training_iterator(dataset, 0, shuffle=False)
    assert [e.index for e in pipeline.take(iterator, 20)] == list(range(10)) * 2


def test_the_position_is_a_json_state_that_resumes_exactly(dataset):
    iterator = pipeline.training_iterator(dataset, 4)
    pipeline.take(iterator, 13)
    state = json.loads(json.dumps(iterator.get_state()))
    expected = [e.index for e in pipeline.take(iterator, 9)]
    resumed = pipeline.training_iterator(dataset, 4)
    resumed.set_state(state)
    assert [e.index for e in pipeline.take(resumed, 9)] == expected


def test_evaluation_layout_is_read_too(tmp_path):
    path = tmp_path / "eval_50.json"
    path.write_text(json.dumps([{"context": "Document 1:\nx", "input": "who?", "answers": ["a"],
                                 "num_docs": 50, "index": 7}]))
    (example,) = pipeline.evaluation_examples(pipeline.load_source(str(path)))
    assert (example.question, example.ground_truths, example.extra_info["index"]) == (
        "who?", ("a",), 7)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "context": 3, "reward_model": {"ground_truth": ["a"]}},
     "row 5: field 'context' must be a string"),
    ({"prompt": [{"role": "user"}], "context": "c", "reward_model": {"ground_truth": ["a"]}},
     "row 5: field 'prompt' must be"),
    ({"prompt": "q", "context": "c", "reward_model": {"ground_truth": []}},
     "row 5: field 'reward_model.ground_truth' must be a non-empty list"),
])
def test_a_malformed_row_names_its_row_and_field(row, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        pipeline.example_from_row({"data_source": "x", **row}, 5, "data.train[0]")


def test_a_source_missing_fields_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q", "context": "c"}) + "\n")
    with pytest.raises(UserError, match="lacks the field"):
        pipeline.load_source(str(path), key="data.train[0]")


# A row of verl's own gsm8k preprocessing (examples/data_preprocess/gsm8k.py): a string ground
# truth, fields of its own (ability), extra_info, a tool's row arguments.
VERL_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "system", "content": "Think step by step."},
               {"role": "user", "content": "Natalia sold 48 clips in April and half as many "
                                           "in May. How many in all?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {"split": "train", "index": 0, "answer": "48 + 24 = 72",
                   "tools_kwargs": {"calc": {"create_kwargs": {"ground_truth": "72"}}}},
}


@pytest.mark.parametrize("layout", ["jsonl", "parquet", "hub_directory"])
def test_an_existing_verl_data_set_loads_unchanged(tmp_path, layout):
    """jsonl, parquet, and a directory as a Hugging Face dataset's repository holds it
    (data/train-00000-of-00001.parquet): the agent gets the chat messages, the ground truth,
    extra_info and every other field as stored; MemAgent, which reads `context`, is refused
    this set with one line."""
    if layout == "jsonl":
        path = tmp_path / "gsm8k.jsonl"
        path.write_text(json.dumps(VERL_ROW) + "\n")
    else:
        path = tmp_path / ("gsm8k.parquet" if layout == "parquet" else "hub")
        target = path if layout == "parquet" else path / "data" / "train-00000-of-00001.parquet"
        write_rows([VERL_ROW], str(target))
    (example,) = pipeline.evaluation_examples(pipeline.load_source(str(path), required=()))
    assert example.prompt == tuple(VERL_ROW["prompt"])
    assert example.question == VERL_ROW["prompt"][-1]["content"]
    assert example.ground_truths == ("72",) and example.context == ""
    assert example.fields["ability"] == "math"
    assert example.fields["reward_model"]["ground_truth"] == "72"
    assert example.extra_info["tools_kwargs"]["calc"]["create_kwargs"] == {"ground_truth": "72"}
    with pytest.raises(UserError, match="lacks the field\\(s\\) context"):
        pipeline.load_source(str(path), key="data.train[0]", required=("context",))


@pytest.mark.parametrize("name, content, problem", [
    ("rows.jsonl", json.dumps(VERL_ROW) + '\n{"data_source": "x", "prompt": [}\n',
     " line 2: not valid JSON: Expecting value at column 33"),
    ("rows.jsonl", "", ": the file is empty (no records)"),
    ("rows.jsonl", "\n  \n", ": the file is empty (no records)"),
    ("rows.json", f"[\n{json.dumps(VERL_ROW)},\n]\n",
     ": not valid JSON (Expecting value at line 3)"),
    ("rows.json", json.dumps(VERL_ROW) + "\n{oops\n",  # JSON lines, as `datasets` reads .json
     " line 2: not valid JSON: Expecting property name enclosed in double quotes at column 2"),
])
@pytest.mark.parametrize("command", ["train", "data"])
def test_a_malformed_or_empty_json_file_is_one_line_naming_it(tmp_path, capsys, command, name,
                                                             content, problem):
    """Through `train` (data.train) and a data command (--source): one line naming the file
    and the line, exit 2, nothing written. (`datasets` said "An error occurred while generating
    the dataset" after two log lines of its own, and `StopIteration` for an empty file.)"""
    from memagent_jax.cli import main
    path = tmp_path / name
    path.write_text(content)
    out = tmp_path / "out"
    if command == "train":
        code = main(["train", "--config", "configs/train/tiny_cpu.yaml", "model.tokenizer=x",
                     f"data.train=[{path}]", f"output_dir={out}"])
        where = "data.train[0]: "
    else:
        code = main(["data", "ruler-hqa", "--source", str(path), "--num-docs", "12",
                     "--out", str(out)])
        where = ""
    assert (code, capsys.readouterr().err.splitlines()) == (
        2, [f"memagent-jax: error: {where}{path}{problem}"])
    assert not out.exists()
