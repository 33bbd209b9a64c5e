"""`method: memagent` with `model.url`: the memory agent's turns on an OpenAI-compatible server.

Each of a question's n trajectories is one MemAgent rollout on a `rollout.client.ServerPolicy`
(what `run --url` runs: each chunk the document's own text, one chat request per turn), and up to
`data.batch_size` rollouts run at once, the way the original's evaluation keeps many samples in
flight against its vLLM server. Each turn asks the server for the seed the local engine samples
it with (`methods.batch_seed`, `client.server_seed`), so a rerun against the same server and
model is reproducible where the server honours `seed` (ours does). Scores, logs and resume are
the runner's, as for the local engine. The server: eval/servers.py.
"""

from __future__ import annotations

from typing import Callable

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.eval.methods import Answer, MemAgentMethod, OnDone, batch_seed
from memagent_jax.eval.servers import server_of
from memagent_jax.rollout.client import run_on_server


class ServerMemAgentMethod(MemAgentMethod):
    """MemAgentMethod's checks, its turns sent to `config.model.url`."""

    def start(self) -> None:  # nothing to load: the server holds the model
        self.server = server_of(self.config)
        self.agent = MemAgent(self.config.memagent, self.tokenizer)

    def run(self, set_name: str, batch: list[tuple[int, dict]], on_done: OnDone,
            on_turn: Callable[[], None], add_turns: Callable[[int], None]) -> None:
        n = self.config.sampling.n
        samples = [self.agent.read(record["input"], record["context"]) for _, record in batch]
        add_turns(n * sum(len(sample.chunks) + 1 for sample in samples))

        def done(i: int, trajectories) -> None:
            answers = []
            for trajectory in trajectories:
                turn = trajectory.final_turn
                tokens = turn.generated_tokens
                if tokens is None:  # a server without usage counts: our tokenizer's count
                    tokens = len(self.tokenizer(turn.reply, add_special_tokens=False)
                                 ["input_ids"])
                answers.append(Answer(trajectory.answer, turn.reply, turn.finish_reason or "",
                                      tokens))
            info = {"context_tokens": samples[i].document_tokens,
                    "turns": len(samples[i].chunks) + 1}
            if self.config.memagent.gates:  # as MemAgentMethod records them
                info["agent"] = {name: sum(t.metrics[name] for t in trajectories) / n
                                 for name in trajectories[0].metrics}
                info["turns"] = info["agent"]["chunks_read"] + 1
            on_done(batch[i][0], answers, info)

        run_on_server(self.server, self.agent, samples,
                      batch_seed(self.config.sampling, set_name, batch), n,
                      max(1, self.config.data.batch_size), lambda i: on_turn(), done)
