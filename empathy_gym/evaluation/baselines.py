"""Baseline agents: fixed policies that need no model, for demos, tests and as floors in
the benchmark.

Each is a callable from the agent-side chat (``info["messages"]``) to the next utterance,
in the conversation's language (read from the system prompt, else the first user message).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

Messages = Sequence[Mapping[str, str]]

_CJK = re.compile(r"[\u4e00-\u9fff]")


def is_chinese(text: str) -> bool:
    """True when ``text`` contains CJK ideographs."""
    return bool(_CJK.search(text))


def conversation_is_chinese(messages: Messages) -> bool:
    """True when the conversation is in Chinese: judged on the system prompt, else on
    the first user message (later user turns may quote anything)."""
    for message in messages:
        if message["role"] in ("system", "user"):
            return is_chinese(message["content"])
    return False


def last_user_message(messages: Messages) -> str:
    """The content of the last ``user`` message ("" when there is none)."""
    for message in reversed(messages):
        if message["role"] == "user":
            return message["content"]
    return ""


def _fragment(text: str, chinese: bool, limit: int = 60) -> str:
    """The first clause of ``text``, without final punctuation, at most ``limit`` chars."""
    first = re.split(r"[。！？!?\n]|(?<=[.])\s", text.strip(), maxsplit=1)[0]
    return first.strip(" ,，.。")[:limit] or ("这件事" if chinese else "this")


class GenericComfortAgent:
    """Always the same generic comfort ("Don't worry, it will be fine"): the baseline
    that RLVER's simulator is designed to see through."""

    EN = "I'm sorry you're going through this. Don't worry, everything will be fine. Stay strong!"
    ZH = "别难过了，一切都会好起来的。加油！"

    def __call__(self, messages: Messages) -> str:
        return self.ZH if conversation_is_chinese(messages) else self.EN


class EchoAgent:
    """Repeats the user's last sentence back as a reflection ("It sounds like ...")."""

    def __call__(self, messages: Messages) -> str:
        text = last_user_message(messages)
        chinese = conversation_is_chinese(messages)
        fragment = _fragment(text, chinese)
        return f"你是说，{fragment}。" if chinese else f"It sounds like you're saying: {fragment}."


class ListenerAgent:
    """A scripted active listener: reflects the user's words, validates the feeling,
    asks an open question, and later offers a balanced view and one gentle suggestion,
    rotating by turn."""

    EN = (
        "It sounds like {f}. That must be really hard. What has been weighing on you the most?",
        "It makes sense that you feel this way about {f}; anyone in your place would be hurt. "
        "I'm listening, tell me more.",
        "You handled a lot here, and you kept trying. Looking back, what do you think you learned about what you need?",
        "On one hand, {f} was not fair to you; on the other hand, the others may have had "
        "their own reasons. How do you see it now?",
        "One small step you could try: write down what you want to say, then talk to them "
        "calmly this week. Would that feel possible?",
    )
    ZH = (
        "听起来{f}，这一定很不容易。最让你难受的是什么？",
        "难怪你会这么难受，{f}，换作是谁都会受伤。我在听，你可以多说一点。",
        "你已经很努力了，也一直在尝试。回头看，你觉得这件事让你明白了自己需要什么？",
        "一方面，{f}对你并不公平；另一方面，他们可能也有自己的原因。你现在怎么看？",
        "也许可以试试一个小步骤：先把想说的话写下来，这周找个时间平静地和他们谈谈。你觉得可行吗？",
    )

    def __call__(self, messages: Messages) -> str:
        text = last_user_message(messages)
        chinese = conversation_is_chinese(messages)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        templates = self.ZH if chinese else self.EN
        return templates[turn % len(templates)].format(f=_fragment(text, chinese))


class ESConvAgent:
    """Cycles through the ESConv support strategies of :attr:`ORDER` (Liu et al., 2021) turn
    by turn, with :mod:`empathy_gym.strategies`' templates quoting the user's
    newest words; the template variant rotates with the turn too."""

    ORDER = (
        "reflection_of_feelings",
        "question",
        "restatement_or_paraphrasing",
        "affirmation_and_reassurance",
        "providing_suggestions",
    )

    def __call__(self, messages: Messages) -> str:
        from empathy_gym.strategies import load_templates, user_words

        templates = load_templates("zh" if conversation_is_chinese(messages) else "en")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        strategy = self.ORDER[turn % len(self.ORDER)]
        variants = templates.variants(strategy, words=user_words(last_user_message(messages)), name=None)
        return variants[(turn // len(self.ORDER)) % len(variants)]


BASELINES: dict[str, type] = {
    "generic": GenericComfortAgent,
    "echo": EchoAgent,
    "listener": ListenerAgent,
    "esconv": ESConvAgent,
}
