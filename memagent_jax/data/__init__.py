"""Data: HotpotQA -> RULER-HQA and training sets, RULER synthetic tasks, set files.

Modules import `datasets` only when a source is read, so evaluation runs without it.
"""
