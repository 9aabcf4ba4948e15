"""How the rule user's replies read: repetition, copied scene text, markdown, hidden-need
leaks and pronoun errors, per 1,000 user turns.

    python benchmarks/rule_user_replies.py                  # prints the table, writes it
    python benchmarks/rule_user_replies.py --no-write

Dialogues: every persona of the ``sage`` bank (SAGE's 100 Chinese profiles) and of the
built-in English bank ``en`` (48), one dialogue each against ``baseline:listener`` and
``baseline:esconv`` (:mod:`empathy_gym.evaluation.baselines`), rule user at ``moderate``, SAGE's
protocol, seed 0 (:func:`empathy_gym.evaluation.benchmark.evaluate`). The user's opening is not
counted (in the ``sage`` bank it is SAGE's own ``first_talk``); every later user message
is a turn.

The checks (written here, independent of the rule user's own filters where possible):

* **repeated sentences**: sentences (split at 。！？!?… and line ends; en at . ! ?) that
  the user already said earlier in the dialogue (the opening included), per 1,000 turns;
  also with clauses (split at commas as well) as the unit.
* **copied scene text**: turns holding a run of 20 characters (zh) or 10 words (en) that
  is verbatim in the persona's scenario.
* **markdown or list fragments**: ``**``, ``#`` headings, list markers (``1.``, ``2、``,
  ``-``), headings ending in a colon, stage-like time stamps (``（3年前）``).
* **hidden-need statements**: a sentence sharing 4 or more character bigrams (zh) or 3
  content words (en) with the intention's own sentence
  (:meth:`empathy_gym.personas.Persona.intention_text`), or matching one of
  :data:`NEED_STATEMENTS` (the need put into words: "why did they do this", "I want
  advice", ...).
* **pronoun errors**: en: "me" as a subject, "I" with a third-person verb, the persona's
  own name or subject pronoun in a told sentence, and first-person words that stand for
  someone else (a scene sentence naming another person whose pronoun the rewriting
  turned into "my"/"me"); zh: the persona's own name, "我我".
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # _machine; empathy_gym: whatever PYTHONPATH finds

from _machine import cpu_model, provenance  # noqa: E402  (benchmarks/_machine.py)

from empathy_gym.evaluation.benchmark import evaluate  # noqa: E402
from empathy_gym.personas import Persona, load_personas  # noqa: E402
from empathy_gym.user.rule_user import RuleUser  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "rule_user_replies.txt"
BANKS = ("sage", "en")
POLICIES = ("baseline:listener", "baseline:esconv")

_ZH_SENTENCE_END = re.compile(r"[。！？!?…\n]+")
_EN_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_CLAUSE = re.compile(r"[，,；;：:]")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_MARKDOWN = re.compile(
    r"\*\*|(?:^|\n)\s*#|(?:^|[\s。！？.!?])\d{1,2}[.、)）]\s*\S|(?:^|\n)\s*[-*•]\s"
    r"|[（(]\s*\d+\s*(?:年|个月|月|周|天|小时)前\s*[）)]|[^\s。！？.!?]{2,14}[：:]\s*$"
)

#: The hidden need put into words, per intention (zh, en): a user who says this has
#: stated what it should only hint at.
NEED_STATEMENTS: dict[str, tuple[str, str]] = {
    "not_at_fault": (
        r"(?:我|自己)(?:根本)?没(?:有)?(?:做)?错|不是我的错|我没有(?:任何)?责任|希望.{0,6}认同我",
        r"\bnot my fault\b|\bi did nothing wrong\b|\bi'?m not to blame\b",
    ),
    "guided_reflection": (
        r"(?:引导|帮)我.{0,4}反思|自我(?:反思|成长)|我想(?:要)?成长",
        r"\bhelp me reflect\b|\bguide me\b|\bgrow from (?:this|it)\b",
    ),
    "dialectical_analysis": (
        r"辩证|客观(?:地)?分析|两方面.{0,4}分析|帮我分析",
        r"\bboth sides\b|\bbalanced view\b|\bhelp me (?:see|analy[sz]e)\b",
    ),
    "deep_empathy": (
        r"(?:深刻|真正)?共情|不(?:要|是)(?:简单的)?安慰|懂我的感受|理解我的感受",
        r"\bunderstand how i feel\b|\bnot (?:just )?comfort\b|\bfeel what i feel\b",
    ),
    "venting_listened": (
        r"(?:听我|让我)(?:说|倾诉|发泄)|倾听|只想发泄|想有人听",
        r"\bjust listen\b|\blisten to me\b|\bi (?:just )?need to vent\b",
    ),
    "others_motives": (
        r"(?:他|她|他们|她们|对方).{0,6}为什么(?:要|会)?(?:这么|这样)(?:做|对我)?|想不通.{0,8}为什么",
        r"\bwhy (?:would|did) (?:he|she|they) (?:do|act)\b|\bwhy (?:he|she|they) did (?:that|this|it)\b",
    ),
    "practical_advice": (
        r"(?:给|要|想要|想听)(?:我)?(?:一些|点|个)?(?:建议|办法|主意)|该怎么(?:解决|办才好)",
        r"\b(?:give me|i want|i need) (?:some )?(?:advice|a plan|practical)\b",
    ),
    "specific_praise": (
        r"夸(?:夸)?我|表扬我|肯定我(?:做的)?|认可我的(?:努力|付出)",
        r"\bpraise me\b|\btell me i did (?:well|good)\b|\brecogni[sz]e (?:what i did|my effort)\b",
    ),
}

_EN_STOP = frozenset(
    "the a an and or but to of in on at for with from that this it is was were be been my "
    "me i you your they them their he she his her him we our us as by not no so if then "
    "than just very really about into over what when who how why which there here have has "
    "had do does did can could would should will want wants wanted".split()
)


#: The table before issue 10's reply changes (commit c1b74c7: the fitted appraisal, the
#: replies of 986ede6), measured with this script.
BEFORE = (
    ("sage", "baseline:listener", "  947    41      957      1646    365       33    37       0"),
    ("sage", "baseline:esconv", "  932    38     1034      1781    313       36    42       0"),
    ("en", "baseline:listener", "  447   142     1651      2371    409        0     0      89"),
    ("en", "baseline:esconv", "  446   136     1756      2583    417        0     0      87"),
)


def sentences(text: str, language: str, clauses: bool = False) -> list[str]:
    """The normalised sentences (or clauses) of ``text``: split, stripped of spaces and
    closing punctuation, lower-cased; empty ones dropped."""
    parts = (_ZH_SENTENCE_END if language == "zh" else _EN_SENTENCE_END).split(text)
    if clauses:
        parts = [piece for part in parts for piece in _CLAUSE.split(part)]
    cleaned = [re.sub(r"[\s。！？!?.…,，;；:：\"“”'‘’()（）]+", " ", part).strip().lower() for part in parts]
    return [part for part in cleaned if part]


def _bigrams(text: str) -> set[str]:
    runs = re.findall(r"[\u4e00-\u9fff]+", text)
    return {run[i : i + 2] for run in runs for i in range(len(run) - 1)}


def _content_words(text: str) -> set[str]:
    return {word[:6] for word in re.findall(r"[a-z']+", text.lower()) if len(word) >= 4 and word not in _EN_STOP}


def states_need(sentence: str, persona: Persona) -> bool:
    """Does ``sentence`` put the persona's hidden intention into words?"""
    language = persona.language
    own = persona.intention_text(language)
    if language == "zh" and len(_bigrams(sentence) & _bigrams(own)) >= 4:
        return True
    if language == "en" and len(_content_words(sentence) & _content_words(own)) >= 3:
        return True
    patterns = NEED_STATEMENTS.get(persona.hidden_intention)
    return bool(patterns and re.search(patterns[0 if language == "zh" else 1], sentence.lower()))


def copies_scene(reply: str, persona: Persona) -> bool:
    """Does ``reply`` hold 20 characters (zh) or 10 words (en) verbatim from the scenario?"""
    if persona.language == "zh":
        scene = re.sub(r"\s+", "", persona.scenario)
        text = re.sub(r"\s+", "", reply)
        return any(text[i : i + 20] in scene for i in range(0, max(len(text) - 19, 0)))
    words = re.findall(r"[A-Za-z']+", persona.scenario.lower())
    shingles = {tuple(words[i : i + 10]) for i in range(len(words) - 9)}
    reply_words = re.findall(r"[A-Za-z']+", reply.lower())
    return any(tuple(reply_words[i : i + 10]) in shingles for i in range(len(reply_words) - 9))


_EN_ME_SUBJECT = re.compile(
    r"(?:^|[.!?;,]\s+|\b(?:and|but|so|because|when|ago|then|after|before|that)\s+)"
    r"me\s+(?:[a-z]+ed|is|was|has|had|have|am|will|would|can|could|did|does|do|got|"
    r"went|made|told|said|felt|left|took|kept|began|started|spent|lost|found)\b",
    re.I,
)
_EN_I_THIRD = re.compile(
    r"\bI\s+(?:(?:always|still|never|just|really|also|often|now|only|even)\s+)?"
    r"(?:is|has|does|doesn't|hasn't|isn't|wants|feels|needs|says|thinks|knows|keeps|"
    r"tries|works|seems|gets|goes|makes|takes|spends|avoids|lives|loves|hates|hopes|"
    r"worries|wonders|refuses|blames|misses)\b"
)
_EN_NAME = re.compile(r"\b[A-Z][a-z]+\b")
_NOT_NAMES = frozenset(
    "I I'm I've I'd I'll The A An And But So Then When After Before Last Next This That "
    "These Those My Her His Their Our Your It It's He She They We You Now Still Even "
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April "
    "May June July August September October November December Christmas Sunday "
    "Mom Dad Mum One Two Three Four Five Six Seven Eight Nine Ten Every Since Because".split()
)


def pronoun_errors(reply: str, persona: Persona) -> int:
    """Pronoun errors in a user reply (see the module docstring)."""
    if persona.language == "zh":
        errors = reply.count("我我")
        if persona.name and persona.name in reply:
            errors += 1
        return errors
    errors = len(_EN_ME_SUBJECT.findall(reply)) + len(_EN_I_THIRD.findall(reply))
    words = (persona.name or "").split()
    variants = set(words) | ({" ".join(words[1:])} if len(words) > 1 else set())
    variants |= {
        w
        for w in re.findall(r"\b[A-Z][a-z]{2,}\b", persona.scenario)
        if any(x != w and x.lower().endswith(w.lower()) for x in words)
    }  # "Seun" of "Oluwaseun"
    for variant in variants - {""}:
        errors += len(re.findall(rf"\b{re.escape(variant)}\b", reply))
    pronoun = re.search(r"\b(she|he)\b", persona.profile + " " + persona.scenario, re.I)
    if pronoun:
        subject = pronoun.group(1).lower()
        errors += len(re.findall(rf"(?:^|[.!?]\s+){subject}\b", reply, re.I))
        own = {"she": r"she|her|hers|herself", "he": r"he|his|him|himself"}[subject]
        other = {"she": r"he|his|him|himself", "he": r"she|her|hers|herself"}[subject]
        names = {w for w in re.findall(r"(?<=[a-z,;:]\s)[A-Z][a-z]+", persona.scenario)} - _NOT_NAMES
        names -= set((persona.name or "").split())
        for scene_sentence in re.split(r"(?<=[.!?])\s+", persona.scenario):
            # a pronoun of the persona's gender after someone else's name, where nothing in
            # the scenario shows that person to be of the other gender: it may be theirs
            risky = any(
                re.search(rf"\b{n}\b.*\b(?:{own})\b", scene_sentence, re.I)
                and not re.search(rf"\b{n}\b[^.!?A-Z]*\b(?:{other})\b", persona.scenario)
                for n in names
                if re.search(rf"\b{n}\b", scene_sentence)
            )
            if not risky:
                continue
            tail = " ".join(re.findall(r"[A-Za-z']+", scene_sentence)[-6:])
            if tail and tail.lower() in reply.lower() and re.search(r"\b(?:my|me|myself)\b", reply):
                errors += 1
    return errors


def measure(records: Sequence[dict], personas: dict[str, Persona]) -> dict[str, float]:
    """The rates over the dialogues ``records`` (one dict of ``evaluate``'s records each)."""
    counts: Counter = Counter()
    for record in records:
        persona = personas[record["persona_id"]]
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        said, said_clauses = (
            set(sentences(users[0], persona.language)),
            set(sentences(users[0], persona.language, clauses=True)),
        )
        for reply in users[1:]:
            counts["turns"] += 1
            counts["characters"] += len(reply)
            for unit, seen, key in (
                (sentences(reply, persona.language), said, "repeated"),
                (sentences(reply, persona.language, clauses=True), said_clauses, "repeated_clauses"),
            ):
                for sentence in unit:
                    counts[key] += sentence in seen
                    seen.add(sentence)
            counts["copied"] += copies_scene(reply, persona)
            counts["markdown"] += bool(_MARKDOWN.search(reply))
            counts["need"] += sum(states_need(s, persona) for s in sentences(reply, persona.language))
            counts["pronoun"] += pronoun_errors(reply, persona)
    turns = max(counts["turns"], 1)
    per_k = {
        key: 1000 * counts[key] / turns
        for key in ("repeated", "repeated_clauses", "copied", "markdown", "need", "pronoun")
    }
    return {"turns": counts["turns"], "mean_chars": counts["characters"] / turns, **per_k}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    started = time.time()
    lines = [
        "# The rule user's replies (benchmarks/rule_user_replies.py), per 1,000 user turns",
        provenance(inputs=["rule-user"]),
        f"# machine: {cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "# one dialogue per persona and policy, rule user 'moderate', SAGE protocol, seed 0; goals (issue 10):",
        "# repeated sentences < 100, markdown 0, need statements 0, pronoun errors 0",
        "",
        f"{'bank':5s} {'policy':18s} {'turns':>5s} {'chars':>5s} {'repeated':>8s} {'(clauses)':>9s} "
        f"{'copied':>6s} {'markdown':>8s} {'need':>5s} {'pronoun':>7s}",
    ]
    for bank in BANKS:
        personas = {p.id: p for p in load_personas(bank)}
        for policy in POLICIES:
            result = evaluate(policy, bank, user=RuleUser(), n_resamples=10)
            rates = measure(result.records, personas)
            lines.append(
                f"{bank:5s} {policy:18s} {rates['turns']:5d} {rates['mean_chars']:5.0f} "
                f"{rates['repeated']:8.0f} {rates['repeated_clauses']:9.0f} {rates['copied']:6.0f} "
                f"{rates['markdown']:8.0f} {rates['need']:5.0f} {rates['pronoun']:7.0f}"
            )
    lines += ["", "before (the replies of 986ede6, with this change's appraisal; same script and seed):"]
    lines += [f"{bank:5s} {policy:18s} {row}" for bank, policy, row in BEFORE]
    lines += [
        "",
        "chars: mean characters per reply; copied: turns with 20 characters (zh) or 10 words (en)",
        "verbatim from the scenario; the other columns count sentences (pronoun: errors).",
        f"took {time.time() - started:.0f} s",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
