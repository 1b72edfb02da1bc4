"""Reflexion (Shinn et al. 2023) over any agent of this package, two trials by default.

A trial is one ordinary episode of the wrapped agent. After a failed trial the LM writes a
reflection on the trial's transcript (greedy, up to a blank line); it enters every later trial's
context as a memory block (:func:`agent_shell.context.render_memory`): the ReAct routing
prompt and, for CB-Agent, the scoring context. The concept stays fixed across trials.
Success is a won trial. An empty reflection is recorded but adds nothing to the memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from agent_shell.agents.react import ReActAgent
from agent_shell.agents.step import AgentLog, EpisodeLike, View
from agent_shell.context import context_text


@dataclass
class Trial:
    """One trial: the finished episode, the agent's log, and the reflection written after it."""

    episode: EpisodeLike
    log: AgentLog
    reflection: str | None = None


@dataclass
class ReflexionResult:
    trials: list[Trial] = field(default_factory=list)

    @property
    def won(self) -> bool:
        return any(t.episode.won for t in self.trials)


class Reflexion:
    """Run ``agent`` for up to ``trials`` trials, reflecting after each failure.

    Args:
        agent: a :class:`ReActAgent` (or CB-Agent); its LM also writes the reflections.
        trials: number of trials (>= 1); the seed's comparison uses 2. With one trial this is
            the plain agent (same name, no reflection), which lets the runner treat every agent
            alike.
    """

    def __init__(self, agent: ReActAgent, trials: int = 2):
        if trials < 1:
            raise ValueError(f"Reflexion needs trials >= 1, got {trials}")
        self.agent = agent
        self.trials = trials
        self.name = agent.name if trials == 1 else f"reflexion-{agent.name}"

    def reflect(self, episode: EpisodeLike, memory: list[str], log: AgentLog | None = None) -> str:
        """The LM's reflection on a failed trial (its transcript under the agent's rendering,
        then the instruction; always one text, also in the chat layout)."""
        log = log if log is not None else AgentLog()
        cfg = self.agent.config
        view = View(episode.start, tuple(episode.steps), memory=tuple(memory), experiences=log.experiences)
        transcript = context_text(self.agent.scoring_context(view))
        prompt = f"{transcript}\n\n{cfg.reflection_instruction.strip()}\nReflection:"
        reply = self.agent.lm.generate(prompt, max_new_tokens=cfg.reflection_tokens, stop=("\n\n",),
                                       temperature=0.0, n=1, seed=cfg.seed)[0]
        return " ".join(reply.split())

    def run(self, new_episode: Callable[[], EpisodeLike],
            on_step: Callable[[list[Trial]], None] | None = None) -> ReflexionResult:
        """Play trials on fresh episodes from ``new_episode()`` until one is won.

        ``on_step(trials)`` runs after every step with all trials so far (the last one live).
        """
        result = ReflexionResult()
        memory: list[str] = []
        for index in range(self.trials):
            trial = Trial(episode=new_episode(), log=AgentLog(memory=list(memory)))
            result.trials.append(trial)

            def save(_episode: EpisodeLike, log: AgentLog, trial: Trial = trial) -> None:
                trial.log = log
                if on_step is not None:
                    on_step(result.trials)

            trial.log = self.agent.run(trial.episode, memory=memory, on_step=save)
            if trial.episode.won or index == self.trials - 1:
                break
            trial.reflection = self.reflect(trial.episode, memory, trial.log)
            if trial.reflection:
                memory.append(trial.reflection)
            if on_step is not None:
                on_step(result.trials)
        return result
