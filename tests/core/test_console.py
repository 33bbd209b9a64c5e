"""What long commands show on stderr: progress bars as tqdm draws them on a terminal and as
plain lines anywhere else, and the block saying what a command is about to do."""

import io

from tqdm import tqdm

from memagent_jax import console


class _Clock:
    """tqdm's clock, moved by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_off_a_terminal_a_bar_is_a_plain_line_every_interval_and_at_the_end(monkeypatch):
    clock, log = _Clock(), io.StringIO()
    monkeypatch.setattr("tqdm.std.time", clock)  # what each bar reads its time from
    with console.progress_bar(total=100, desc="samples", unit="sample", file=log) as bar:
        for step in range(100):
            clock.now += 1.0  # a step a second: 100 s in all
            bar.update(1)
            bar.set_postfix_str(f"step {step}", refresh=True)  # redraws, as the trainer's
            if step == 50:
                tqdm.write("a line of the command's own", file=log)  # clears and redraws
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text  # no redraws, no cursor moves
    lines = text.splitlines()
    bars = [line for line in lines if line.startswith("samples:")]
    # one line every 30 s of the 100 (at 30, 60 and 90 s), and one at the end
    assert [line.split("|")[2].split()[0] for line in bars] == [
        "30/100", "60/100", "90/100", "100/100"], lines
    assert bars[-1].startswith("samples: 100%|##########| 100/100")
    assert "a line of the command's own" in lines


def test_off_a_terminal_a_short_bar_is_one_line_and_a_disabled_one_none():
    log = io.StringIO()
    assert list(console.progress_bar(range(3), desc="docs", file=log)) == [0, 1, 2]
    bar = console.progress_bar(total=0, desc="chunks", position=1, file=log)
    bar.total += 2  # as the eval's chunk bar learns its total
    bar.refresh()
    bar.update(2)
    bar.close()
    bar.close()
    console.progress_bar(total=5, desc="quiet", file=log, disable=True).close()
    lines = log.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["docs", "chunks"], lines
    assert "3/3" in lines[0] and "2/2" in lines[1] and "\r" not in log.getvalue()


def test_on_a_terminal_the_bar_is_tqdms():
    screen = _Terminal()
    with console.progress_bar(total=2, desc="train", file=screen) as bar:
        bar.update(2)
    assert "\rtrain: 100%" in screen.getvalue()


def test_announce_is_a_block_of_aligned_lines_on_stderr(capsys):
    console.announce("train", {"model": "m", "run dir": "runs/x"})
    assert capsys.readouterr().err == "train\n  model    m\n  run dir  runs/x\n"
