"""A Ctrl-C as it lands in practice in long commands: while a garbage collection's callback
runs (JAX registers one, and building a document or loading a model allocates without pause),
where Python's KeyboardInterrupt is printed as "Exception ignored" and dropped."""

import gc
import signal

from memagent_jax.synthetic import tasks as synthetic


def ctrl_c_in_a_gc_callback(monkeypatch, call: int = 1) -> None:
    """From `make_sample`'s `call`-th call on (the commands' own work, past their checks), the
    next garbage collection raises SIGINT in this process from its callback."""
    ctrl_c_in_a_gc_callback_at(monkeypatch, synthetic, "make_sample", call)


def ctrl_c_in_a_gc_callback_at(monkeypatch, owner, name: str, call: int = 1) -> None:
    """At the `call`-th call of `owner.name` (a module's function, patched where the code
    under test looks it up), before it runs, the next garbage collection raises SIGINT in this
    process from its callback."""
    def callback(phase, info):
        if phase == "start":
            gc.callbacks.remove(callback)
            signal.raise_signal(signal.SIGINT)

    function = getattr(owner, name)

    def armed(*args, **kwargs):
        armed.calls += 1
        if armed.calls == call:
            gc.callbacks.append(callback)
            gc.collect()
        return function(*args, **kwargs)

    armed.calls = 0
    monkeypatch.setattr(owner, name, armed)
