"""`memagent-jax trace --carries`: how near a memory agent is to losing what its memory holds,
scored turn by turn without running the agent.

A fact the agent has written can be lost turns later, to a rewrite that puts another word in
the memory. The turns that can do this are carries: the ideal memory holds facts
(`tasks.oracle_memories`) and the chunk adds none, so the right reply is the memory
unchanged. One forward pass scores a
carry teacher-forced: for each reply token, its logit's margin over the best other token. A
carry whose weakest margin is negative is one the greedy agent, given the ideal memory, would
rewrite: its first negative token is where the greedy reply leaves the memory, and the rival
token is what it writes there. Scoring a document's carries costs a forward pass a turn, not a
read, and counts near misses (small positive margins) as well as rewrites.
"""

from __future__ import annotations

import dataclasses

import numpy as np

BATCH = 64  # carries a forward pass


@dataclasses.dataclass
class Carry:
    document: int
    chunk: int              # 0-based chunk the turn reads
    prompt: list[int]       # the agent's update prompt around the ideal memory and the chunk
    reply: list[int]        # the ideal memory again, then the end-of-text token


@dataclasses.dataclass
class Score:
    margin: float           # the weakest reply token's logit minus the best other logit
    position: int           # that token's index in the reply
    rival: int              # the best other token there
    keep: float | None = None  # P(the first reply token is the keep gate's word), gate on


def carry_turns(agent, document, index: int) -> list[Carry]:
    """The carries of `document` (a tasks.Sample, number `index`) as `agent` reads it:
    the turns whose ideal memory is not empty and is the same after the turn as before."""
    from memagent_jax.synthetic.oracle import end_token
    from memagent_jax.synthetic.tasks import oracle_memories

    sample = agent.read(document.question, document.context)
    tokenizer = agent.tokenizer
    ideal = oracle_memories([tokenizer.decode(chunk) for chunk in sample.chunks],
                            [dataclasses.asdict(f) for f in document.facts])
    end, carries = end_token(agent), []
    for t in range(1, len(sample.chunks)):
        if ideal[t - 1] and ideal[t] == ideal[t - 1]:
            memory = tokenizer(ideal[t], add_special_tokens=False)["input_ids"]
            carries.append(Carry(index, t, agent.prompts.update(sample.problem_ids, memory,
                                                                sample.chunks[t]),
                                 [*memory, end]))
    return carries


def score_carries(model, carries: list[Carry], on_batch=None, keep_id: int | None = None
                  ) -> list[Score]:
    """Each carry's weakest reply token under `model` (an nnx Qwen), teacher-forced: the
    prompt and the reply in one right-padded row, no mask (padding after a token never
    affects it); with `keep_id` (the keep gate's word), also the probability that the reply's
    first token is it instead. on_batch(carries done) after every forward pass."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def margins(state, tokens, starts, targets, keep_id):
        """tokens [B, L], starts [B] (first reply position), targets [B, W] (the reply,
        padded with -1), keep_id [] -> margins [B, W], rivals [B, W], P(keep first) [B]."""
        net = nnx.merge(graphdef, state)
        before = starts[:, None] - 1 + jnp.arange(targets.shape[1])[None, :]      # [B, W]
        hidden = jnp.take_along_axis(net.hidden(tokens), before[..., None], axis=1)
        logits = net.logits(hidden).astype(jnp.float32)                            # [B, W, V]
        right = jnp.take_along_axis(logits, jnp.maximum(targets, 0)[..., None], axis=-1)[..., 0]
        others = jnp.where(jax.nn.one_hot(targets, logits.shape[-1], dtype=bool), -jnp.inf,
                           logits)
        keep = jax.nn.softmax(logits[:, 0], axis=-1)[:, keep_id]                    # [B]
        return right - others.max(-1), others.argmax(-1), keep

    width = max(len(c.reply) for c in carries)
    length = -(-(max(len(c.prompt) for c in carries) + width) // 64) * 64
    scores = []
    for start in range(0, len(carries), BATCH):
        batch = carries[start:start + BATCH]
        tokens = np.zeros((BATCH, length), np.int32)
        starts = np.ones(BATCH, np.int32)
        targets = np.full((BATCH, width), -1, np.int32)
        for i, carry in enumerate(batch):
            row = carry.prompt + carry.reply
            tokens[i, :len(row)] = row
            starts[i] = len(carry.prompt)
            targets[i, :len(carry.reply)] = carry.reply
        margin, rival, keep = (np.asarray(x) for x in margins(
            state, tokens, starts, targets, np.int32(keep_id or 0)))
        for i in range(len(batch)):
            m = np.where(targets[i] >= 0, margin[i], np.inf)
            j = int(m.argmin())
            scores.append(Score(float(m[j]), j, int(rival[i, j]),
                                None if keep_id is None else float(keep[i])))
        if on_batch:
            on_batch(len(batch))
    return scores


def run_carries(model: str, task: str, length: int, seed: int, num_samples: int,
                budgets: dict) -> list[tuple[Carry, Score]]:
    """Scores every carry of `num_samples` documents of (task, length, seed); prints a line a
    document (carries, rewrites, the first one and what it would write) and a summary
    (progress on stderr)."""
    from memagent_jax.console import progress_bar
    from memagent_jax.errors import UserError
    from memagent_jax.synthetic import tasks as synthetic
    from memagent_jax.synthetic.demo import load_agent

    if num_samples < 1:
        raise UserError(f"--num-samples must be at least 1, got {num_samples}")
    loaded, _, agent, config = load_agent(model, task, length, budgets)
    carries = [c for i in range(num_samples)
               for c in carry_turns(agent, synthetic.make_sample(task, length, seed, i), i)]
    print(f"{len(carries)} carries in {num_samples} {task} documents of {length:,} tokens "
          f"(seed {seed}), {config.chunk_tokens} tokens a turn, scored teacher-forced by {model}")
    if not carries:
        return []
    keep_id = None
    if "keep" in agent.config.gates:
        keep_id, = agent.tokenizer("keep", add_special_tokens=False)["input_ids"]
    with progress_bar(total=len(carries), desc="scoring", unit="carry") as bar:
        scores = score_carries(loaded.model, carries, bar.update, keep_id)
    decode = agent.tokenizer.decode
    for index in range(num_samples):
        mine = [(c, s) for c, s in zip(carries, scores) if c.document == index]
        rewrites = [(c, s) for c, s in mine if s.margin < 0]
        line = f"{index:>4} {len(mine)} carries, {len(rewrites)} rewritten"
        if rewrites:
            c, s = rewrites[0]
            line += (f"; first after chunk {c.chunk + 1}: {decode([s.rival])!r} for "
                     f"{decode([c.reply[s.position]])!r} (margin {s.margin:.2f})")
        if mine:
            line += f"; weakest margin {min(s.margin for _, s in mine):.2f}"
        print(line)
    margins = np.array([s.margin for s in scores])
    rewritten = sorted({c.document for c, s in zip(carries, scores) if s.margin < 0})
    print(f"rewritten {int((margins < 0).sum())} of {len(margins)} carries, in documents "
          f"{', '.join(map(str, rewritten)) or 'none'}; margin quantiles 0.1 % "
          f"{np.quantile(margins, 0.001):.2f}, 1 % {np.quantile(margins, 0.01):.2f}, "
          f"median {np.median(margins):.2f}")
    if keep_id is not None:
        keeps = np.array([s.keep for s in scores])
        print(f"P(keep) as the first reply token: mean {keeps.mean():.3g}, median "
              f"{np.median(keeps):.3g}, 10 % quantile {np.quantile(keeps, 0.1):.3g}")
    return list(zip(carries, scores))
