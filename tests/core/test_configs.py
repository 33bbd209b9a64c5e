"""Every file under configs/ loads against its schema (no device, no data read): train/,
synthetic/ and lookup/ as training configs, their agents and plugins built (`build_run`);
eval/ as evaluation configs. A file added to configs/ is loaded here without being listed.
A file that names a `base` gives only keys that change what its base resolves to."""

import glob
import os

import pytest
import yaml

from memagent_jax.eval.config import EvalConfig
from memagent_jax.rl.build import build_run
from memagent_jax.rl.config import load_train_config
from memagent_jax.runconfig import load_config, to_dict
from memagent_jax.synthetic.plugin import PluginSection

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
FILES = sorted(os.path.relpath(p, CONFIGS)
               for p in glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True))


def _raw(name) -> dict:
    with open(os.path.join(CONFIGS, name), encoding="utf-8") as f:
        return yaml.safe_load(f)


def _resolved(name) -> dict:
    """The file's config as the command that runs it loads it (`eval` or `train`)."""
    path = os.path.join(CONFIGS, name)
    if name.startswith("eval"):
        return to_dict(load_config(EvalConfig, path))
    return to_dict(load_train_config(path))


def _flat(value, prefix="") -> dict:
    """Dotted keys to leaf values, into every mapping (a plugin's keys too) but `mesh`, one
    shape given whole (configs/train/'s targets); a list is a leaf."""
    if isinstance(value, dict) and prefix != "mesh.":
        return {k: v for key, item in value.items()
                for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value}


OVERLAYS = [name for name in FILES if "base" in _raw(name)]


def test_every_config_is_in_a_purpose_folder():
    assert FILES and {f.split(os.sep)[0] for f in FILES} == {"train", "eval", "synthetic",
                                                              "lookup"}


@pytest.mark.parametrize("name", FILES)
def test_the_config_loads(name):
    path = os.path.join(CONFIGS, name)
    if name.startswith("eval"):
        config = load_config(EvalConfig, path)
        assert config.data.sets and config.output_dir
        return
    config = load_train_config(path)
    plugin = build_run(config).plugin
    stem = os.path.basename(name)[:-5]
    if name.startswith(os.path.join("synthetic", "rl_only")):  # RL-only rungs need no plugin
        assert config.output_dir == f"runs/{os.path.basename(os.path.dirname(name))}/{stem}"
    elif name.startswith("synthetic"):
        assert plugin is not None, "a recipe step without its plugin"
        assert config.output_dir == f"runs/synthetic/{stem}"
    elif name.startswith("lookup"):  # the tool agent's start (a plugin's rows), then DAPO
        assert (plugin is not None) == (config.learner.loss == "sft")
        assert config.output_dir == f"runs/lookup/{stem}"
        assert config.agent["module"] == ("memagent_jax.agents.program"  # examples/ programs
                                          if stem.startswith("program") else
                                          "memagent_jax.agents.tool_calling")
    else:  # the product's training configs need no experiment
        assert plugin is None and not config.plugin


@pytest.mark.parametrize("name", OVERLAYS)
def test_each_key_an_overlay_gives_changes_its_base(name):
    """An overlay repeats none of its base's values: each fact of a chain of configs is
    stated once, where it starts to hold (a key given again with the base's value would
    silently stop following a later change of the base)."""
    base = os.path.normpath(os.path.join(os.path.dirname(name), _raw(name)["base"]))
    given = set(_flat(_raw(name))) - {"base"}
    before, after = _flat(_resolved(base)), _flat(_resolved(name))
    assert given and given <= set(after), given - set(after)
    assert not [key for key in given if before.get(key) == after[key]]


def test_the_recipe_is_a_chain_of_numbered_steps():
    """Each step starts from the previous step's last checkpoint, and names at most the
    previous step as its base."""
    steps = sorted(f for f in FILES if os.path.dirname(f) == "synthetic")
    assert [os.path.basename(f)[:2] for f in steps] == [f"{i:02d}" for i in range(len(steps))]
    for previous, step in zip(steps, steps[1:]):
        with open(os.path.join(CONFIGS, step)) as f:
            raw = yaml.safe_load(f)
        assert raw.get("base") in (None, os.path.basename(previous)), step
        before = load_train_config(os.path.join(CONFIGS, previous))
        after = load_train_config(os.path.join(CONFIGS, step))
        assert after.model.path == f"{before.checkpoint_dir}/{before.steps}", step


@pytest.mark.parametrize("name", [f for f in FILES if f.startswith(os.path.join("synthetic",
                                                                               "arms"))])
def test_an_arm_branches_off_the_step_it_names(name):
    """A run beside the chain (synthetic/arms/) either continues the step it names as its
    base, from that step's last checkpoint, or is a variant of it, from the same start; and
    writes to a directory of its own."""
    with open(os.path.join(CONFIGS, name)) as f:
        base = yaml.safe_load(f)["base"]
    step = load_train_config(os.path.normpath(os.path.join(CONFIGS, os.path.dirname(name),
                                                           base)))
    arm = load_train_config(os.path.join(CONFIGS, name))
    assert arm.model.path in (f"{step.checkpoint_dir}/{step.steps}", step.model.path)
    assert arm.output_dir != step.output_dir


HONEST = sorted(f for f in FILES if os.path.dirname(f) == os.path.join("synthetic",
                                                                     "rl_only_honest"))


def test_the_honest_rl_only_ladder_is_a_chain_from_the_rl_only_start_with_its_target():
    """configs/synthetic/rl_only_honest (issue 73, unrun): numbered steps, each from the
    previous one's last checkpoint. Steps 00-02 are the RL-only ladder's start but for the
    target (format_all_facts), the tokenizer with the gates' words and its data, the gates,
    and the paths; the DAPO rungs run the original's group size, clip and KL, the soft
    overlong penalty and both gates, on lengths that grow to 256 chunks, and log the synthetic
    plugin's validation metrics (the per-turn loss rate), taking nothing else of it."""
    assert [os.path.basename(f)[:2] for f in HONEST] == [f"{i:02d}" for i in range(len(HONEST))]
    configs = [load_train_config(os.path.join(CONFIGS, f)) for f in HONEST]
    for before, after in zip(configs, configs[1:]):
        assert after.model.path == f"{before.checkpoint_dir}/{before.steps}"
    differ = {"model.path", "model.tokenizer", "data.train", "data.val", "memagent.keep_gate",
              "memagent.exit_gate", "plugin.target", "output_dir"}
    for name, honest in zip(HONEST[:3], configs[:3]):
        start = load_train_config(os.path.join(CONFIGS, "synthetic", "rl_only",
                                               os.path.basename(name)))
        ours, theirs = _flat(to_dict(honest)), _flat(to_dict(start))
        assert {k for k in ours if ours[k] != theirs.get(k)} <= differ, name
        assert honest.plugin["target"] == "format_all_facts" and honest.memagent.gates == (
            "keep", "exit")
    rungs = [c for c in configs if c.learner.loss == "dapo"]
    assert len(rungs) == len(configs) - 3
    for rung in rungs:
        assert (rung.rollout.n, rung.learner.kl_coef, rung.learner.eps_low,
                rung.learner.eps_high) == (16, 0.001, 0.2, 0.2)
        assert rung.overlong.enabled and not rung.dynamic_sampling.enabled
        assert rung.memagent.gates == ("keep", "exit")  # the plugin for its metrics alone:
        assert rung.plugin == {"module": "memagent_jax.synthetic.plugin"}
        assert build_run(rung).plugin.section == PluginSection()  # no rows, no starts
    assert [r.memagent.max_chunks for r in rungs] == [1, 8, 32, 128, 256]


REBUILT = sorted(f for f in FILES if os.path.dirname(f) == os.path.join("synthetic",
                                                                      "rl_only_rebuilt"))


def test_the_rebuilt_rl_only_ladder_is_the_honest_one_from_a_start_without_selection():
    """configs/synthetic/rl_only_rebuilt (issue 84): a chain, each step from the previous one's
    last checkpoint; steps 00-04 are the honest ladder's but for the start's rows (the keep
    share, the bare box), the exit gate off and the paths; the persistence rung trains half
    its prompts from the policy's own carried memory, on documents up to 32 chunks."""
    assert [os.path.basename(f)[:2] for f in REBUILT] == [f"{i:02d}" for i in range(len(REBUILT))]
    configs = [load_train_config(os.path.join(CONFIGS, f)) for f in REBUILT]
    for before, after in zip(configs, configs[1:]):
        assert after.model.path == f"{before.checkpoint_dir}/{before.steps}"
    differ = {"model.path", "memagent.exit_gate", "plugin.keep_share", "plugin.final_reply",
              "output_dir"}
    for name, rebuilt in zip(REBUILT, configs):
        assert rebuilt.memagent.gates == ("keep",), name
        honest_name = os.path.join(os.path.dirname(name).replace("rebuilt", "honest"),
                                   os.path.basename(name))
        if os.path.exists(os.path.join(CONFIGS, honest_name)):
            honest = load_train_config(os.path.join(CONFIGS, honest_name))
            ours, theirs = _flat(to_dict(rebuilt)), _flat(to_dict(honest))
            assert {k for k in ours if ours[k] != theirs.get(k)} <= differ, name
    start, persistence = configs[2], configs[-1]
    assert start.plugin["keep_share"] == 0.25 and start.plugin["final_reply"] == "box"
    section = build_run(persistence).plugin.section
    assert (section.carry_from, section.carry_starts * 2) == ("policy",
                                                             persistence.prompts_per_step)
    assert persistence.memagent.max_chunks == 32 and persistence.learner.loss == "dapo"
