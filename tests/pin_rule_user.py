"""Writes tests/data/rule_user_pinned.json: the rule user's emotion changes and replies on
fixed dialogues, so that a change that should keep its appraisals (a speed-up, a
refactor) can be checked to keep them. Run only when the appraisals are meant to change:

    python tests/pin_rule_user.py
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gymnasium as gym

import empathy_gym  # noqa: F401  (registers the ids)

PINNED = Path(__file__).parent / "data" / "rule_user_pinned.json"
EN = [
    "That sounds really hard. What happened next?",
    "I hear you.",
    "Why don't you just quit?",
    "It makes sense that you feel this way. What do you need now?",
    "I'm here. What? I'm here.",
    "You should try meditation and exercise. 1. Sleep 2. Eat well",
    "It wasn't your fault.",
    "That must have been exhausting at work. How did your manager react?",
    "ok",
    "Thank you for telling me.",
]
ZH = [
    "这确实很不容易。后来发生了什么？",
    "我在听。",
    "你为什么不直接辞职？",
    "难怪你会难过，你现在最需要什么？",
    "我在。什么？我在。",
    "建议你：1. 多运动 2. 早点睡",
    "这不是你的错。",
    "辛苦你了，家里人怎么说？",
    "嗯",
    "谢谢你愿意说出来。",
]


def dialogues() -> dict[str, dict]:
    """``{"<bank>/<seed>": {"changes": [...], "replies_sha256": "..."}}`` for 12 dialogues
    per bank, each played with the bank's utterances rotated by the seed, every third
    turn prefixed with the start of the user's last reply."""
    pinned = {}
    for bank, texts in (("en", EN), ("zh", ZH)):
        env = gym.make("EmpathyDialogue-v0", personas=bank)
        for seed in range(12):
            observation, _ = env.reset(seed=seed)
            replies, changes = [observation], []
            for turn in range(len(texts)):
                utterance = texts[(seed + turn) % len(texts)]
                if turn % 3 == 1:  # echo the user's words: the rule user weighs shared words
                    utterance = f"{observation[:60]} {utterance}"
                observation, _, terminated, truncated, info = env.step(utterance)
                replies.append(observation)
                changes.append(info["emotion_change"])
                if terminated or truncated:
                    break
            digest = hashlib.sha256("\n\x00".join(replies).encode()).hexdigest()
            pinned[f"{bank}/{seed}"] = {"changes": changes, "replies_sha256": digest}
    return pinned


if __name__ == "__main__":
    PINNED.write_text(json.dumps(dialogues(), indent=1) + "\n")
    print(f"wrote {PINNED}")
