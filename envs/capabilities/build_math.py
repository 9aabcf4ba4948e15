"""Writes ``math.jsonl``: the offline math task's 100 word problems (half of one step, so
that a 135M model is not at the floor, half of two), drawn with a fixed seed. Run
``python envs/capabilities/build_math.py``; the file is committed, and
tests/test_capabilities.py recomputes every answer from its operands."""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jon"]
THINGS = ["apples", "stickers", "marbles", "books", "pencils", "coins", "cards", "shells"]
TEMPLATES = {
    ("+",): "{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
    ("-",): "{name} has {a} {thing} and gives away {b}. How many {thing} does {name} have now?",
    (
        "+",
        "-",
    ): "{name} has {a} {thing}. {name} gets {b} more and then gives away {c}. How many {thing} does {name} have now?",
    ("-", "+"): "{name} has {a} {thing}. {name} loses {b} and then finds {c}. How many {thing} does {name} have now?",
    (
        "*",
        "+",
    ): "{name} buys {a} boxes with {b} {thing} in each, and already had {c}. How many {thing} does {name} have now?",
    ("*", "-"): "{name} fills {a} bags with {b} {thing} each and then uses {c} of them. How many {thing} are left?",
}
APPLY = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}


def answer(a: int, b: int, c: int, ops: list[str]) -> int:
    """``a op1 b``, or ``(a op1 b) op2 c`` with two operations."""
    first = APPLY[ops[0]](a, b)
    return APPLY[ops[1]](first, c) if len(ops) == 2 else first


def items(count: int = 100, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    drawn = []
    while len(drawn) < count:
        steps = 1 if len(drawn) % 2 == 0 else 2
        ops = rng.choice([key for key in TEMPLATES if len(key) == steps])
        if steps == 1:  # small numbers: a 135M model gets about half of them
            a, b = rng.randint(2, 20), rng.randint(1, 9)
        elif ops[0] == "*":
            a, b = rng.randint(2, 9), rng.randint(2, 12)
        else:
            a, b = rng.randint(10, 60), rng.randint(2, 30)
        c = rng.randint(1, 20)
        if ops[0] == "-" and b >= a or answer(a, b, c, list(ops)) < 0:
            continue
        text = TEMPLATES[ops].format(name=rng.choice(NAMES), thing=rng.choice(THINGS), a=a, b=b, c=c)
        row = {"id": len(drawn), "question": text, "a": a, "b": b, "c": c, "ops": list(ops)}
        drawn.append(row | {"answer": str(answer(a, b, c, list(ops)))})
    return drawn


if __name__ == "__main__":
    path = Path(__file__).with_name("math.jsonl")
    path.write_text("".join(json.dumps(row) + "\n" for row in items()), encoding="utf-8")
    print(f"wrote {path}")
