"""How an engine samples (`SamplingParams`) and how a prompt becomes token ids
(`encode_prompt`), kept apart from the engine protocol so that the controller, which only
describes what to sample, never imports torch.

What it does not: sample, hold a model or a tokenizer (encode_prompt is handed one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: `n` completions per prompt; `greedy` ignores temperature/top_p (held-out eval)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    stop: tuple[str, ...] = ()
    seed: int = 0
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature} (use greedy=True for argmax)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not stop for stop in self.stop):
            raise ValueError("stop strings must be non-empty")


PromptFormat = Literal["plain", "chat"]


def encode_prompt(tokenizer: Any, text: str, prompt_format: PromptFormat = "plain") -> tuple[int, ...]:
    """The token ids an engine feeds for a task's prompt text: the text itself without special
    tokens (plain), or the text as one user message through the tokenizer's chat template with
    the assistant turn opened (chat). Every engine encodes with this function, and the ids go
    into the trajectory (`prompt_token_ids`), so the trainer scores exactly what was sampled."""
    if prompt_format == "plain":
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("model.prompt_format = 'chat' needs a tokenizer with a chat template; this one has none (use 'plain')")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """A whole conversation ([{"role", "content"}, ...]) through the tokenizer's chat
    template, the assistant turn opened: the text a multi-turn agent's next reply continues.
    Fed to an engine as a `plain` prompt, it encodes to the ids `encode_prompt(..., "chat")`
    gives for a single user message (both tokenize the rendered text without special tokens).
    A tokenizer without a chat template is refused (ValueError)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("this model's tokenizer has no chat template, so a conversation cannot be rendered for it; "
                         "use an instruct/chat model (e.g. SmolLM2-135M-Instruct, `make smollm2`)")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
