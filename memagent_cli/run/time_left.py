"""How long a reading has left, refined at every step from the steps so far: the prompt and
reply speeds they measured, the memory's real length (a step's prompt less its chunk) and how
long their replies ran. Before the first step it is what was expected (run/expect.py), if
anything was. It assumes every chunk left is read (a reader that stops early stops sooner).

Pure arithmetic on the reading's events, so the views (views/progress.py) and the note of a
long reading (run/expect.py) each keep their own."""

from __future__ import annotations

from dataclasses import dataclass, field

from memagent_cli.progress import Expected
from memagent_cli.reader import Answering, Event, Finished, StepFinished, StepStarted

# Replies of the last few steps say how long the next ones run (a memory grows, then holds).
RECENT = 3


@dataclass
class TimeLeft:
    """Seconds a reading of `total_tokens` has left after its latest event."""

    total_tokens: int
    expected: Expected | None = None
    _prompt_tokens: int = 0
    _prompt_seconds: float = 0.0
    _replied: int = 0
    _reply_seconds: float = 0.0
    _replies: list[int] = field(default_factory=list)
    _overhead: int = 0  # prompt tokens of the last step beside its chunk: template, memory
    _read_to: int = 0  # document tokens read
    _steps_left: int | None = None
    _answering: bool = False
    _finished: bool = False
    _elapsed: float = 0.0  # seconds of the steps finished

    def add(self, event: Event) -> None:
        """Take one event of the reading into account."""
        if isinstance(event, StepStarted):
            self._steps_left = event.total - event.position
        elif isinstance(event, StepFinished):
            step = event.step
            gen, chunk = step.generation, step.chunk
            self._prompt_tokens += gen.prompt_tokens
            self._prompt_seconds += gen.prompt_seconds
            self._replied += gen.completion_tokens
            self._reply_seconds += gen.generation_seconds
            self._replies = [*self._replies, gen.completion_tokens][-RECENT:]
            self._overhead = max(gen.prompt_tokens - (chunk.token_end - chunk.token_start), 0)
            self._read_to = chunk.token_end
            self._steps_left = event.total - event.position - 1
            self._elapsed += gen.seconds
        elif isinstance(event, Answering):
            self._answering, self._steps_left = True, 0
        elif isinstance(event, Finished):
            self._finished = True

    @property
    def measured(self) -> bool:
        """Whether a step has finished: the figure is then this reading's own."""
        return bool(self._replies)

    def seconds(self) -> float | None:
        """Seconds left after the latest event; None before any step where nothing was
        expected."""
        if self._finished:
            return 0.0
        if not self._replies:
            if self.expected is None:
                return None
            return max(self.expected.seconds - self._elapsed, 0.0)
        per_prompt = self._prompt_seconds / max(self._prompt_tokens, 1)
        per_reply = self._reply_seconds / max(self._replied, 1)
        reply = sum(self._replies) / len(self._replies)
        answer = self._answer(per_prompt, per_reply, reply)
        if self._answering:
            return answer
        steps = self._steps_left or 0
        document = max(self.total_tokens - self._read_to, 0)
        prompts = (document + steps * self._overhead) * per_prompt
        return prompts + steps * reply * per_reply + answer

    def _answer(self, per_prompt: float, per_reply: float, reply: float) -> float:
        """The answer call: as expected where something was, else a prompt of the memory
        and a reply as long as a memory, at this reading's speeds."""
        if self.expected is not None:
            return self.expected.answer
        return self._overhead * per_prompt + reply * per_reply


def duration(seconds: float) -> str:
    """Seconds as a person reads them: "45s", "3m05s", "2h10m"."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
