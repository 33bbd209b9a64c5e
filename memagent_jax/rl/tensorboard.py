"""TensorBoard scalars without TensorFlow.

`flax.metrics.tensorboard` needs TensorFlow; tensorboard's own `EventFileWriter` and protobufs
write the same event files. Only process 0 writes (every process computes the same global
metrics, so one copy is enough); on the others `ScalarWriter` is a no-op. tensorboard is
imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from memagent_jax.extras import needs


class ScalarWriter:
    """scalars(step, {tag: value}) appends one event per finite value; flush() / close().

    process_index defaults to jax.process_index(); pass 0 to write regardless."""

    def __init__(self, log_dir: str, process_index: int | None = None):
        if process_index is None:
            import jax
            process_index = jax.process_index()
        self.log_dir = log_dir
        self._writer = None
        if process_index == 0:
            with needs("train", "TensorBoard logging"):
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
            self._writer = EventFileWriter(log_dir)

    @property
    def active(self) -> bool:
        return self._writer is not None

    def scalars(self, step: int, values: Mapping[str, float], wall_time: float | None = None
                ) -> None:
        """Writes every value that is a finite number (NaN/inf would break plots; the trainer
        logs those separately)."""
        if self._writer is None:
            return
        with needs("train", "TensorBoard logging"):
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary

        entries = []
        for tag, value in values.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                entries.append(Summary.Value(tag=tag, simple_value=number))
        if entries:
            self._writer.add_event(Event(wall_time=wall_time or time.time(), step=int(step),
                                         summary=Summary(value=entries)))

    def start_session(self, step: int) -> None:
        """Marks a restart whose first step is `step`: TensorBoard then drops the events at
        `step` and later that a killed run wrote (the resumed run writes them again)."""
        if self._writer is None:
            return
        with needs("train", "TensorBoard logging"):
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        self._writer.add_event(Event(wall_time=time.time(), step=int(step),
                                     session_log=SessionLog(status=SessionLog.START)))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
