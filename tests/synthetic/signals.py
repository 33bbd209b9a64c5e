"""A Ctrl-C as it lands in practice in the synthetic commands: while a garbage collection's
callback runs (JAX registers one, and building a document allocates without pause), where
Python's KeyboardInterrupt is printed as "Exception ignored" and dropped."""

import gc
import signal

from memagent_jax.synthetic import tasks as synthetic


def ctrl_c_in_a_gc_callback(monkeypatch, call: int = 1) -> None:
    """From `make_sample`'s `call`-th call on (the commands' own work, past their checks), the
    next garbage collection raises SIGINT in this process from its callback."""
    def callback(phase, info):
        if phase == "start":
            gc.callbacks.remove(callback)
            signal.raise_signal(signal.SIGINT)

    make_sample = synthetic.make_sample

    def armed(*args, **kwargs):
        armed.calls += 1
        if armed.calls == call:
            gc.callbacks.append(callback)
            gc.collect()
        return make_sample(*args, **kwargs)

    armed.calls = 0
    monkeypatch.setattr(synthetic, "make_sample", armed)
