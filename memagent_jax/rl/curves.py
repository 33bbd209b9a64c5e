"""Training curves from runs' TensorBoard event files, as one PNG (`memagent-jax curves`).

Reads the scalars with TensorBoard's own reader (`EventAccumulator`), so the picture shows
what `tensorboard --logdir` shows. Several runs (a recipe's steps: a supervised warm-up, then
DAPO from its checkpoint) are drawn one after another on a common step axis, each from where
the previous one ended, with a dashed line where a run starts; a tag a run does not log is
left out of that run's stretch. With `overlay`, runs that start from one checkpoint (the arms
of an ablation) are drawn over each other, each from its own step 0.
"""

from __future__ import annotations

import os

from memagent_jax.errors import UserError
from memagent_jax.extras import needs
from memagent_jax.fileutil import atomic_file

DEFAULT_TAGS = ("reward/mean", "val/accuracy", "rollout/memory_length", "dynamic/kept_fraction")


def event_dir(run: str) -> str:
    """The TensorBoard directory of a run's output directory (or the directory itself)."""
    for candidate in (os.path.join(run, "logs", "tensorboard"), run):
        if os.path.isdir(candidate) and any(n.startswith("events.out.tfevents")
                                            for n in os.listdir(candidate)):
            return candidate
    raise UserError(f"{run}: no TensorBoard event files (neither in {run}/logs/tensorboard "
                    "nor in the directory itself)")


def read_scalars(run: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...] in step order} of every scalar a run logged."""
    with needs("train", "reading TensorBoard event files"):
        from tensorboard.backend.event_processing import event_accumulator
    accumulator = event_accumulator.EventAccumulator(event_dir(run), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def _check_tags(runs: list[str], scalars: list[dict], tags) -> None:
    """Raises UserError, naming the tags the runs log, for a tag asked for that no run logs
    (its panel would be empty). Of the default tags only all of them missing is refused: a
    supervised run logs no dynamic/kept_fraction, and its empty panel says so."""
    logged = sorted(set().union(*scalars))
    unknown = [tag for tag in tags if tag not in logged]
    default = tuple(tags) == DEFAULT_TAGS
    if unknown and not (default and len(unknown) < len(tags)):
        what = "none of the default --tags" if default else "--tags " + " ".join(unknown)
        raise UserError(f"{what}: not logged by {', '.join(runs)}; the runs log: "
                        f"{', '.join(logged) or 'no scalars'}")


def plot_curves(runs: list[str], out: str, tags=DEFAULT_TAGS,
                names: list[str] | None = None, overlay: bool = False) -> None:
    """One panel per tag, the runs in sequence or overlaid (module docstring); written to
    `out` (PNG, or another format matplotlib writes, by its extension; whole or not at all).
    """
    with needs("train", "drawing curves"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.backend_bases import FigureCanvasBase
    picture = os.path.splitext(out)[1].lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if picture not in formats:  # matplotlib would draw everything first, then refuse (or add .png)
        raise UserError(f"--out {out}: not a picture file's name; end it in .png (or "
                        f"{', '.join('.' + f for f in sorted(formats) if f != 'png')})")

    scalars = [read_scalars(run) for run in runs]
    _check_tags(runs, scalars, tags)
    names = names or [os.path.basename(os.path.normpath(run)) for run in runs]
    columns = 2 if len(tags) > 1 else 1
    rows = -(-len(tags) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
    offsets, offset = [], 0
    for values in scalars:
        offsets.append(offset)
        if not overlay:
            offset += max((step for series in values.values() for step, _ in series), default=0)
    for panel, tag in zip(axes.flat, tags):
        for number, (values, start, name) in enumerate(zip(scalars, offsets, names)):
            series = values.get(tag, [])
            if series:  # a run keeps its colour in every panel
                panel.plot([start + s for s, _ in series], [v for _, v in series],
                           marker="." if len(series) < 30 else None, label=name,
                           color=f"C{number}")
            if start:
                panel.axvline(start, color="grey", linestyle="--", linewidth=0.8)
        panel.set_title(tag)
        panel.set_xlabel("step")
        panel.grid(alpha=0.3)
        if panel.get_legend_handles_labels()[0]:  # an empty panel: no legend, no warning
            panel.legend(fontsize=8)
    for panel in list(axes.flat)[len(tags):]:
        panel.set_visible(False)
    figure.tight_layout()
    with atomic_file(out) as tmp:
        figure.savefig(tmp, dpi=110, format=picture)
    plt.close(figure)
