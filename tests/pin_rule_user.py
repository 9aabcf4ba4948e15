"""Writes tests/data/rule_user_pinned.json: the rule user's emotion changes and replies on
fixed dialogues (benchmarks/_inputs.py's ``rule_user_dialogues``), so that a change that
should keep its appraisals (a speed-up, a refactor) can be checked to keep them. Run only
when the appraisals are meant to change:

    python tests/pin_rule_user.py
"""

from __future__ import annotations

import json
from pathlib import Path

from script_modules import load_script

PINNED = Path(__file__).parent / "data" / "rule_user_pinned.json"


def dialogues() -> dict[str, dict]:
    """:func:`rule_user_dialogues` of benchmarks/_inputs.py, played now."""
    return load_script(Path(__file__).parents[1] / "benchmarks" / "_inputs.py").rule_user_dialogues()


if __name__ == "__main__":
    PINNED.write_text(json.dumps(dialogues(), indent=1) + "\n")
    print(f"wrote {PINNED}")
