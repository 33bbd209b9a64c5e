"""`memagent-jax curves`: a run's TensorBoard scalars, read back with TensorBoard's reader, as
one PNG; runs drawn one after another or overlaid; bad input is one line."""

import pytest

from memagent_jax.cli import main
from memagent_jax.rl.curves import plot_curves, read_scalars
from memagent_jax.rl.tensorboard import ScalarWriter


def _run(path, steps, values):
    writer = ScalarWriter(str(path / "logs" / "tensorboard"), process_index=0)
    for step in steps:
        writer.scalars(step, {tag: fn(step) for tag, fn in values.items()})
    writer.close()
    return str(path)


def test_scalars_round_trip_and_runs_are_drawn_in_sequence(tmp_path, monkeypatch):
    sft = _run(tmp_path / "sft", range(1, 11), {"reward/mean": lambda s: 1.0,
                                                  "val/accuracy": lambda s: 10.0 * s})
    rl = _run(tmp_path / "rl", range(1, 6), {"reward/mean": lambda s: s / 5,
                                              "dynamic/kept_fraction": lambda s: 0.5})
    scalars = read_scalars(rl)
    assert scalars["reward/mean"] == [(s, pytest.approx(s / 5)) for s in range(1, 6)]
    assert set(read_scalars(sft)) == {"reward/mean", "val/accuracy"}
    out = tmp_path / "curves.png"
    assert main(["curves", sft, rl, "--out", str(out), "--names", "sft", "sft+rl"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    import matplotlib.pyplot as plt
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)

    def lines(**options):
        plot_curves([sft, rl], str(tmp_path / "again.png"), ("reward/mean",), **options)
        (panel,) = [a for a in drawn.pop().axes if a.get_visible()]
        return [list(line.get_xdata()) for line in panel.get_lines()]

    sft_steps, rl_steps, *marks = lines()
    assert sft_steps == list(range(1, 11))
    assert rl_steps == list(range(11, 16))  # after the warm-up's 10 steps
    assert marks == [[10, 10]]  # a dashed line where the second run starts
    # Arms from one checkpoint (`--overlay`): each from its own first step, no start line.
    assert lines(overlay=True) == [list(range(1, 11)), list(range(1, 6))]
    assert main(["curves", sft, rl, "--out", str(tmp_path / "arms.png"), "--overlay",
                 "--tags", "reward/mean"]) == 0
    (panel,) = [a for a in drawn.pop().axes if a.get_visible()]
    assert [list(line.get_xdata()) for line in panel.get_lines()] == [
        list(range(1, 11)), list(range(1, 6))]


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["curves", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no TensorBoard event files" in err[0]
    run = _run(tmp_path / "run", [1], {"reward/mean": lambda s: 1.0})
    assert main(["curves", run, "--out", str(tmp_path / "c.png"), "--names", "a", "b"]) == 2
    assert "--names: 2 names for 1 runs" in capsys.readouterr().err


def test_an_existing_out_or_one_no_picture_format_has_is_refused_before_reading(tmp_path,
                                                                                 capsys):
    """As every command's, an existing output is refused, not overwritten; a name without a
    picture format's extension (matplotlib would refuse it, or add .png) is one line naming
    the formats, before any run is read."""
    run = _run(tmp_path / "run", [1], {"reward/mean": lambda s: 1.0})
    (tmp_path / "c.png").write_text("kept")
    assert main(["curves", run, "--out", str(tmp_path / "c.png")]) == 2
    assert capsys.readouterr().err == (f"memagent-jax: error: --out: {tmp_path / 'c.png'} "
                                       "exists; remove it or choose another --out\n")
    assert (tmp_path / "c.png").read_text() == "kept"
    for name in ("c.txt", "c"):
        assert main(["curves", str(tmp_path / "no-run"), "--out", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"memagent-jax: error: --out {tmp_path / name}: not a picture "
                              "file's name; end it in .png (or .") and ".svg" in err, err
        assert err.count("\n") == 1
    assert main(["curves", run, "--out", str(tmp_path / "c.svg")]) == 0
    assert (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png", "c.svg", "run"]


def test_a_tag_no_run_logs_is_refused_with_the_tags_they_log(tmp_path, capsys):
    """An asked-for tag no run logs would be an empty panel; of the default tags, only all of
    them missing is refused (a supervised run logs no kept fraction: that panel is empty)."""
    sft = _run(tmp_path / "sft", [1, 2], {"learner/loss": lambda s: 1.0})
    rl = _run(tmp_path / "rl", [1, 2], {"learner/loss": lambda s: 1.0,
                                        "reward/mean": lambda s: 0.5})
    out = tmp_path / "c.png"
    for argv, line in [
        (["--tags", "reward/mean", "nope", "val/acc"], f"--tags nope val/acc: not logged by "
                                                      f"{sft}, {rl}; the runs log: "
                                                      "learner/loss, reward/mean"),
        ([], None),  # reward/mean is drawn
    ]:
        assert main(["curves", sft, rl, "--out", str(out), *argv]) == (2 if line else 0)
        assert capsys.readouterr().err.strip().splitlines() == (
            [f"memagent-jax: error: {line}"] if line else [])
        assert out.exists() == (line is None)
    assert main(["curves", sft, "--out", str(tmp_path / "sft.png")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"memagent-jax: error: none of the default --tags: not logged by {sft}; the runs log: "
        "learner/loss")
    assert not (tmp_path / "sft.png").exists()
