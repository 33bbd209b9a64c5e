"""`method: memagent` with `model.url`: the memory agent's turns on an OpenAI-compatible server.

Each of a question's n trajectories is one `rollout.client.run_on_server` loop (what `run
--url` runs: the chunks decoded to text, one chat request per turn), and up to
`data.batch_size` loops run at once on threads, the way the original's evaluation keeps many
samples in flight against its vLLM server. Trajectory k of row r asks the server for seeds
derived from (sampling.seed, set, r, k), so a rerun against the same server and model is
reproducible where the server honours `seed` (ours does). Scores, logs and resume are the
runner's, as for the local engine.
"""

from __future__ import annotations

import concurrent.futures
import os
import zlib
from typing import Callable

from memagent_jax.eval.methods import Answer, MemAgentMethod, OnDone
from memagent_jax.rollout.memagent import read_sample
from memagent_jax.rollout.client import api_key_from_env, run_on_server


class ServerMemAgentMethod(MemAgentMethod):
    """MemAgentMethod's checks, its turns sent to `config.model.url`."""

    def start(self) -> None:  # nothing to load: the server holds the model
        model = self.config.model
        self.name = model.served_name or os.path.basename(os.path.normpath(model.path or ""))

    def run(self, set_name: str, batch: list[tuple[int, dict]], on_done: OnDone,
            on_turn: Callable[[], None], add_turns: Callable[[int], None]) -> None:
        s, n = self.config.sampling, self.config.sampling.n
        budgets = self.config.memagent
        samples = [read_sample(self.tokenizer, record["input"], record["context"], budgets)
                   for _, record in batch]
        add_turns(n * sum(len(sample.chunks) + 1 for sample in samples))

        def trajectory(i: int, k: int) -> Answer:
            row = batch[i][0]
            seed = zlib.crc32(f"{s.seed}/{set_name}/{row}/{k}".encode()) & 0x7FFFFFFF
            record = run_on_server(
                self.config.model.url, self.name, samples[i], self.tokenizer,
                max_memory_tokens=budgets.max_memory_tokens,
                max_final_tokens=budgets.max_final_tokens, temperature=s.temperature,
                top_p=s.top_p, api_key=api_key_from_env(), seed=seed,
                thinking=budgets.thinking,
                on_turn=lambda *_: on_turn())
            reply = record["final_reply"]
            tokens = record["final_tokens"]
            if tokens is None:  # a server without usage counts: our tokenizer's count
                tokens = len(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
            return Answer(record["answer"], reply, record["finish_reason"] or "", tokens)

        workers = max(1, min(self.config.data.batch_size, n * len(batch)))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = [[pool.submit(trajectory, i, k) for k in range(n)]
                       for i in range(len(batch))]
            try:
                for i, answers in enumerate(futures):
                    on_done(batch[i][0], [f.result() for f in answers],
                            {"context_tokens": samples[i].document_tokens,
                             "turns": len(samples[i].chunks) + 1})
            except BaseException:
                for answers in futures:
                    for future in answers:
                        future.cancel()
                raise
