"""YAML run configs: defaults, files, dotted overrides, and errors that name the key."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import pytest

from memagent_jax.errors import ConfigError, UserError
from memagent_jax.runconfig import differences, load_config, to_dict, write_config


@dataclasses.dataclass(frozen=True)
class Optim:
    SYNONYMS: ClassVar[dict[str, str]] = {"learning_rate": "lr"}
    lr: float = 1e-6
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 20


@dataclasses.dataclass(frozen=True)
class Run:
    name: str = "run"
    lengths: tuple[int, ...] = (7000,)
    max_chunks: int | None = None
    optim: Optim = Optim()

    def __post_init__(self):
        if not self.lengths:
            raise ConfigError("", "lengths must not be empty")


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_file_and_overrides(tmp_path):
    path = write(tmp_path, "name: a\nlengths: [7000, 14000]\noptim:\n  lr: 1e-5\n")
    config = load_config(Run, path, ["optim.schedule=cosine", "max_chunks=4", "optim.lr=2e-6"])
    assert config == Run("a", (7000, 14000), 4, Optim(2e-6, "cosine", 20))
    assert to_dict(config)["optim"] == {"lr": 2e-6, "schedule": "cosine", "warmup_steps": 20}
    assert load_config(Run) == Run()
    assert load_config(Run, None, ["max_chunks=null"]).max_chunks is None


@pytest.mark.parametrize("text, overrides, words", [
    ("nmae: a\n", [], ["c.yaml", "unknown key 'nmae'"]),
    ("optim:\n  lr: fast\n", [], ["c.yaml", "'optim.lr'", "float", "'fast'"]),
    ("", ["optim.warmup_steps=2.5"], ["'optim.warmup_steps'", "int", "2.5"]),
    ("", ["optim.warmup_steps=true"], ["'optim.warmup_steps'", "int", "True"]),
    ("", ["optim.schedule=linear"], ["'optim.schedule'", "'constant'", "'linear'"]),
    ("", ["optim.betas=1"], ["unknown key 'optim.betas'"]),
    ("", ["lengths=[7000, x]"], ["'lengths[1]'", "int"]),
    ("", ["lengths=[]"], ["lengths must not be empty"]),
    ("", ["optim=3"], ["'optim'", "a mapping"]),
    ("", ["lr"], ["override 'lr'", "key=value"]),
    ("- 1\n", [], ["c.yaml", "mapping"]),
    ("a: [\n", [], ["c.yaml", "not valid YAML"]),
])
def test_errors_name_the_key(tmp_path, text, overrides, words):
    with pytest.raises(UserError) as e:
        load_config(Run, write(tmp_path, text), overrides)
    message = str(e.value)
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("text, overrides, words", [
    ("optim:\n  lr: 1e-5\n", ["optim.lrr=3"], ["override 'optim.lrr=3'", "unknown key"]),
    ("name: a\n", ["optim.warmup_steps=x"], ["override 'optim.warmup_steps=x'", "int"]),
    ("optim:\n  lr: 1e-5\n lengths: [1]\n", [], ["c.yaml", "line 3, column"]),
    # PyYAML keeps a key's last value silently
    ("name: a\noptim:\n  lr: 1e-5\nname: b\n", [],
     ["c.yaml: not valid YAML (line 4, column 1: key 'name' given twice, first on line 1)"]),
    ("optim:\n  lr: 1e-5\n  warmup_steps: 3\n  lr: 2e-5\n", [],
     ["c.yaml: not valid YAML (line 4, column 3: key 'lr' given twice, first on line 2)"]),
])
def test_errors_point_at_what_is_wrong(tmp_path, text, overrides, words):
    """A bad override is blamed on the override, not the file; bad YAML says where."""
    with pytest.raises(UserError) as e:
        load_config(Run, write(tmp_path, text), overrides)
    assert all(word in str(e.value) for word in words), str(e.value)
    if overrides:
        assert "c.yaml" not in str(e.value)


def test_a_merged_mapping_s_keys_may_be_given_again(tmp_path):
    """YAML's `<<` merge: the mapping's own keys override the merged ones (not a key twice)."""
    path = write(tmp_path, "optim:\n  <<: {lr: 1.0e-5, warmup_steps: 3}\n  lr: 2.0e-5\n")
    assert load_config(Run, path).optim == Optim(lr=2e-5, warmup_steps=3)


def test_a_directory_given_as_the_config(tmp_path):
    with pytest.raises(UserError, match="is a directory, expected a YAML config file"):
        load_config(Run, str(tmp_path))


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_binary_file_given_as_the_config_is_one_line(tmp_path, capsys, command):
    from memagent_jax.cli import main
    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(range(256)) * 64)
    assert main([command, "--config", str(path)]) == 2
    assert capsys.readouterr() == ("", f"memagent-jax: error: {path}: not a YAML text file "
                                       "(not UTF-8: invalid start byte)\n")


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(Run, str(tmp_path / "nope.yaml"))


def test_a_file_changes_the_file_its_base_names(tmp_path):
    """A recipe step states what differs from the step it continues: its keys over its base's
    (a base's base too, paths relative to the file naming them), a section key by key."""
    (tmp_path / "steps").mkdir()
    (tmp_path / "first.yaml").write_text(
        "name: first\nlengths: [1, 2]\noptim:\n  lr: 1e-5\n  schedule: cosine\n")
    (tmp_path / "steps" / "second.yaml").write_text(
        "base: ../first.yaml\noptim:\n  lr: 3e-6\nmax_chunks: 8\n")
    (tmp_path / "steps" / "third.yaml").write_text("base: second.yaml\nlengths: [5]\n")
    second = load_config(Run, str(tmp_path / "steps" / "second.yaml"))
    assert second == Run("first", (1, 2), 8, Optim(3e-6, "cosine", 20))
    third = load_config(Run, str(tmp_path / "steps" / "third.yaml"), ["optim.warmup_steps=3"])
    assert third == Run("first", (5,), 8, Optim(3e-6, "cosine", 3))
    assert load_config(Run, str(tmp_path / "first.yaml")).max_chunks is None


@pytest.mark.parametrize("files, words", [
    ({"c.yaml": "base: gone.yaml\n"}, ["gone.yaml: config file not found (the base of",
                                        "c.yaml)"]),
    ({"c.yaml": "base: d.yaml\n", "d.yaml": "base: c.yaml\n"}, ["d.yaml: key 'base'",
                                                                "loop of bases"]),
    ({"c.yaml": "base: [d.yaml]\n"}, ["c.yaml: key 'base'", "a config file's path"]),
    ({"c.yaml": "base: d.yaml\n", "d.yaml": "optim:\n  lrr: 1\n"},
     ["c.yaml (over ", "d.yaml): unknown key 'optim.lrr'"]),
])
def test_a_bad_base_is_one_line_naming_it(tmp_path, files, words):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(UserError) as e:
        load_config(Run, str(tmp_path / "c.yaml"))
    assert "\n" not in str(e.value)
    assert all(word in str(e.value) for word in words), str(e.value)


@dataclasses.dataclass(frozen=True)
class Wide:
    """A section of many keys, as the learner's."""
    alpha: int = 0
    beta: int = 0
    gamma: int = 0
    delta: int = 0
    epsilon: int = 0
    zeta: int = 0
    eta: int = 0
    theta: int = 0
    iota: int = 0
    kappa: int = 0
    lambda_: int = 0


@dataclasses.dataclass(frozen=True)
class Wider:
    optim: Optim = Optim()
    wide: Wide = Wide()


@pytest.mark.parametrize("text, overrides, hint", [
    ("", ["optim.lrr=3"], "unknown key 'optim.lrr' (did you mean 'optim.lr'?)"),
    ("optim:\n  warmup_stepz: 3\n", [], "unknown key 'optim.warmup_stepz' (did you mean "
                                         "'optim.warmup_steps'?)"),
    ("", ["wide.thetta=1"], "unknown key 'wide.thetta' (did you mean 'wide.theta' or "
                            "'wide.eta' or 'wide.zeta'?)"),  # the closest first
    ("", ["optim.speed=1"], "unknown key 'optim.speed' (known keys here: lr, schedule, "
                            "warmup_steps)"),
    # another framework's name (transformers, verl), which no spelling is close to
    ("", ["optim.learning_rate=1"], "unknown key 'optim.learning_rate' (did you mean "
                                    "'optim.lr'?)"),
    # a section of many keys, none close: where they are, not all of them
    ("", ["wide.omega=1"], "unknown key 'wide.omega' (none of the 11 keys here is close; they "
                           "are the fields of tests.core.test_runconfig.Wide)"),
])
def test_an_unknown_key_suggests_the_keys_close_to_it(tmp_path, text, overrides, hint):
    with pytest.raises(UserError) as e:
        load_config(Wider, write(tmp_path, text), overrides)
    assert str(e.value).endswith(hint), str(e.value)


@dataclasses.dataclass(frozen=True)
class Train:
    COMMAND: ClassVar[str] = "train"
    OTHER_CONFIGS: ClassVar[dict] = {"eval": ("method", "sampling")}
    steps: int = 1


def test_a_config_of_another_command_is_named_as_one(tmp_path):
    path = write(tmp_path, "method: memagent\nsampling: {n: 2}\nsteps: 3\n")
    with pytest.raises(UserError) as e:
        load_config(Train, path)
    assert str(e.value) == (f"{path}: a config for `memagent-jax eval` (it has 'method', "
                            "'sampling'), not for `memagent-jax train`: run it with "
                            "`memagent-jax eval --config`")


def test_a_written_config_reads_back_and_differences_name_every_change(tmp_path):
    config = load_config(Run, None, ["lengths=[1, 2]", "optim.lr=3e-6", "max_chunks=8"])
    path = str(tmp_path / "run" / "config.yaml")
    write_config(config, path, "the run's config\nrerun it")
    assert open(path).read().startswith("# the run's config\n# rerun it\nname: run\n")
    assert load_config(Run, path) == config
    other = load_config(Run, path, ["optim.lr=1e-5", "optim.schedule=cosine", "name=b"])
    assert differences(to_dict(config), to_dict(other)) == [
        "name was 'run', now 'b'", "optim.lr was 3e-06, now 1e-05",
        "optim.schedule was 'constant', now 'cosine'"]
    assert differences(to_dict(config), to_dict(other), ("name", "optim")) == []
