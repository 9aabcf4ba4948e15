"""The rule user's story: a persona's scenario turned into first-person sentences it can
tell, in English and Chinese (:func:`persona_story`).

The rewriting is a heuristic (the name and the persona's pronoun become I / me / my, 我;
third-person verbs lose their -s), right for the plain sentences scenarios are written
in. A sentence where it could go wrong is not told: en, one quoting others' words about
the persona, or with a pronoun of the persona's gender after another person's name; zh,
one where the persona's name or pronoun is left after the rewriting. No sentence voices
the hidden intention (:class:`_LeakCheck`): the agent has to find the need.

Example: the scenario "Maya covered night shifts for months. Last week her manager
promoted Tom instead of her and praised his work. She now dreads going back to the
ward." gives the state "I now dread going back to the ward." and the details "I covered
night shifts for months.", "Last week my manager promoted Tom instead of me and praised
his work."
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from empathy_gym.personas import Persona
from empathy_gym.user.rule_lexicon import CJK, LanguageRules, cjk_bigrams

#: At most this many story sentences are kept for the user to tell, one per turn.
MAX_DETAILS = 12


@dataclass(frozen=True)
class PersonaStory:
    """What the rule user derives once from a persona.

    Attributes:
        content: content units of the story (see
            :class:`~empathy_gym.user.rule_lexicon.Scan`), for grounding.
        intention_content: content units of a free-text hidden intention (empty for the
            eight standard ones, which have lexicons).
        state: the opening's sentence(s), the scenario's current state (en: its last
            sentence; zh: :func:`_zh_state`), "" when none.
        fragment: a short first-person clause for ``{fragment}`` slots ("" when none).
        details: further story sentences, at most :data:`MAX_DETAILS`, told one per turn
            in :data:`~empathy_gym.user.rule_user.DETAIL_BANDS`.
    """

    content: frozenset[str]
    intention_content: frozenset[str]
    state: str
    fragment: str
    details: tuple[str, ...]


def persona_story(persona: Persona, language: LanguageRules) -> PersonaStory:
    """A persona's :class:`PersonaStory`; ``language``: the persona's language rules."""
    leaks = _LeakCheck(persona, language)
    if persona.language == "zh":
        story = _zh_plain(_zh_story(persona.scenario))
        state = _zh_state(persona, leaks)
        fragment, details = _zh_fragment(state), _zh_details(persona, leaks, state)
        joiner = ""
    else:
        story = persona.scenario
        sentences = _en_sentences(persona, leaks)
        state = sentences[-1:]  # the last sentence: the current state
        fragment, details = _en_fragment(state), tuple(sentences[:-1][:MAX_DETAILS])
        joiner = " "
    intention_content = frozenset() if persona.intention_is_standard else language.units(persona.hidden_intention)[1]
    return PersonaStory(
        content=language.units(story)[1],
        intention_content=intention_content,
        state=joiner.join(state),
        fragment=fragment,
        details=details,
    )


# -- what gives the hidden intention away ----------------------------------------------

#: A sentence that voices what the user wants from the listener gives the need away.
_ZH_WISH = re.compile(
    r"希望.{0,6}(?:有人|对方|能有人|找到一个|得到一个)|渴望.{0,4}(?:有人|获得|得到)|"
    r"(?:希望|渴望|想要|期待|盼望|需要).{0,10}(?:理解|认同|认可|倾听|听(?:我|她|他)|支持|肯定|夸|"
    r"安慰|共情|建议|分析|解释|明白(?:他|她|他们|对方)为什么)|"
    r"(?:为什么|为何)(?:要|会)?(?:这么|这样)(?:做|对(?:我|她|他))|"
    r"(?:想要|希望|想|试图)(?:找出|弄清|知道|明白|搞清楚|了解|分析).{0,12}(?:原因|为什么|动机|想法)|"
    r"而(?:不是|非|不仅仅是)(?:简单|单纯|一味|直接)|隐藏主题|(?i:emotion|validation)"
)
_EN_WISH = re.compile(
    r"(?i)\b(?:wants?|wishes|hopes?|longs?|needs?) (?:someone|somebody|a listener|"
    r"the listener|people|others|them|him|her) to\b|hidden (?:need|intention)"
)
#: Shared units with the intention's own sentence that count as giving it away.
LEAK_OVERLAP = {"zh": 4, "en": 3}


class _LeakCheck:
    """Does a scenario sentence give the hidden intention away? It does when it voices
    a wish aimed at the listener, or shares :data:`LEAK_OVERLAP` units with the
    intention's own sentence (zh: character bigrams; en: content stems)."""

    def __init__(self, persona: Persona, language: LanguageRules):
        self.code = persona.language
        text = persona.intention_text(self.code)
        self.units = frozenset(cjk_bigrams(text)) if self.code == "zh" else language.units(text)[1]
        self.language = language

    def __call__(self, sentence: str) -> bool:
        if self.code == "zh":
            shared = frozenset(cjk_bigrams(sentence)) & self.units
            return bool(_ZH_WISH.search(sentence)) or len(shared) >= LEAK_OVERLAP["zh"]
        shared = self.language.units(sentence)[1] & self.units
        return bool(_EN_WISH.search(sentence)) or len(shared) >= LEAK_OVERLAP["en"]


# -- English ---------------------------------------------------------------------------

_EN_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")
_EN_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Prof|Jr|Sr|vs|etc|e\.g|i\.e)|\b[A-Z])\.$")


def _en_split(text: str) -> list[str]:
    """Sentences of ``text``; no split after "Mr.", "Dr.", initials and the like."""
    sentences: list[str] = []
    for piece in _EN_SENTENCE.split(text.strip()):
        if sentences and _EN_ABBREVIATION.search(sentences[-1]):
            sentences[-1] += " " + piece
        else:
            sentences.append(piece)
    return [sentence.strip() for sentence in sentences if sentence.strip()]


_SUBJECT_CONTEXT = frozenset(
    "and but so because that when while since after before if as until though although where now then".split()
)
#: Words after which a name is an object whatever follows ("told Ravi", "with Maya").
_OBJECT_BEFORE = frozenset(
    "to of for with at about from by on in into than like told asked promoted blamed called "
    "sent gave showed let made helped thanked left texted emailed invited met saw".split()
)
_OBJECT_NEXT = frozenset(
    "that to and about in on at for with from the a an again too off up down out back away "
    "as like into over or but so when because feel know see how what why this it more less "
    "most enough anymore everywhere all alone once twice there here now then yet today "
    "tonight if until while after before since though either completely ever anyway instead "
    "later directly personally".split()
)
#: Words after which an -s word is taken for a verb (in :func:`_en_coordinated_verbs`).
_VERB_NEXT = frozenset(
    "the a an my his her their your me him them it every any all no this that at to on in "
    "through about with for into up down out awake off over back home as been".split()
)
_ADVERBS = (
    "now|still|often|always|never|also|just|really|barely|rarely|sometimes|usually|"
    "constantly|increasingly|secretly|quietly|only|even|finally|already|mostly|simply|"
    "honestly|hardly|myself"
)
_BASE_FORMS = {
    "is": "am",
    "isn't": "am not",
    "has": "have",
    "hasn't": "haven't",
    "does": "do",
    "doesn't": "don't",
    "are": "am",
    "aren't": "am not",
    "were": "was",
    "weren't": "wasn't",
    "lies": "lie",
    "dies": "die",
    "ties": "tie",
}
_NOT_VERBS = frozenset(
    "always sometimes perhaps thus this its yes less unless towards "
    "afterwards nevertheless regardless across was as".split()
)


def _base_form(verb: str) -> str:
    """The first-person form of a third-person present verb ("avoids" -> "avoid")."""
    low = verb.lower()
    if low in _BASE_FORMS:
        return _BASE_FORMS[low]
    if low in _NOT_VERBS or len(low) <= 3 or not low.endswith("s") or low.endswith(("ss", "us", "is")):
        return verb
    if low.endswith("ies"):
        return verb[:-3] + "y"
    if low.endswith(("ches", "shes", "sses", "xes", "zes", "oes")):
        return verb[:-2]
    return verb[:-1]


def _subject_position(before: str, after: str = "") -> bool:
    """Is a noun phrase between ``before`` and ``after`` a subject? It is when it starts
    a clause, or when the next word is a verb ("Six weeks ago Hannah posted")."""
    before = before.rstrip()
    if not before or before[-1] in '.!?;:,("-':
        return True
    last = re.search(r"[A-Za-z']+$", before)
    if bool(last) and last.group(0).lower() in _SUBJECT_CONTEXT:
        return True
    following = re.match(r"\s+([a-z][a-z']*)", after)
    if following is None or (last is not None and last.group(0).lower() in _OBJECT_BEFORE):
        return False
    # After a name, a lower-case word that does not start a phrase of its own is its verb.
    return following.group(1) not in _OBJECT_NEXT


def _keep_case(original: str, replacement: str) -> str:
    """``replacement`` capitalised like ``original`` ("I" and "I'm" stay capitalised)."""
    if replacement == "I" or replacement.startswith("I'"):
        return replacement
    return replacement.capitalize() if original[:1].isupper() else replacement


def _en_pronoun(persona: Persona) -> str | None:
    """The persona's pronoun ("she", "he"; ``None`` when unknown or "they")."""
    for text in (persona.profile, persona.scenario):
        found = re.search(r"\b(she|he|they)\b", text, re.I)
        if found:
            word = found.group(1).lower()
            return None if word == "they" else word
    return None


def _en_first_person(sentence: str, name: str | None, pronoun: str | None, second_person: bool) -> str:
    """Turn a third-person (or second-person) sentence about the persona into the first
    person: the name and the persona's pronoun become I / me / my, and the verb after
    "I" loses its third-person -s."""

    def subject_or_object(match: re.Match) -> str:
        return "I" if _subject_position(match.string[: match.start()], match.string[match.end() :]) else "me"

    if name:
        for variant in _en_name_variants(name, sentence):
            sentence = re.sub(rf"\b{re.escape(variant)}'s\b", "my", sentence)
            sentence = re.sub(rf"\b{re.escape(variant)}\b", subject_or_object, sentence)
    forms = {"she": ("she", "her", "her", "herself"), "he": ("he", "him", "his", "himself")}
    if pronoun in forms:
        subject, obj, possessive, reflexive = forms[pronoun]

        def object_or_possessive(match: re.Match) -> str:
            word = match.group(0).lower()
            if word == obj and word == possessive:  # "her": decided by the next word
                following = re.match(r"\s*([A-Za-z']+)", match.string[match.end() :])
                is_object = following is None or following.group(1).lower() in _OBJECT_NEXT
            else:
                is_object = word == obj
            return _keep_case(match.group(0), "me" if is_object else "my")

        sentence = re.sub(rf"(?i)\b{reflexive}\b", "myself", sentence)
        sentence = re.sub(rf"(?i)\b{subject}'s been\b", "I've been", sentence)
        sentence = re.sub(rf"(?i)\b{subject}'s\b", "I'm", sentence)
        sentence = re.sub(rf"(?i)\b{subject}\b", "I", sentence)
        sentence = re.sub(rf"(?i)\b(?:{obj}|{possessive})\b", object_or_possessive, sentence)
    if second_person:
        for pattern, replacement in (
            ("you're", "I'm"),
            ("you've", "I've"),
            ("you'll", "I'll"),
            ("you'd", "I'd"),
            ("yourself", "myself"),
            ("yours", "mine"),
            ("your", "my"),
        ):
            sentence = re.sub(rf"(?i)\b{pattern}\b", lambda m, r=replacement: _keep_case(m.group(0), r), sentence)
        sentence = re.sub(r"(?i)\byou\b", subject_or_object, sentence)
    sentence = re.sub(
        rf"\bI((?:\s+(?:{_ADVERBS}))?)\s+([A-Za-z']+)", lambda m: f"I{m.group(1)} {_base_form(m.group(2))}", sentence
    )
    sentence = _en_coordinated_verbs(sentence)
    return sentence[:1].upper() + sentence[1:]


#: A capitalised word inside a sentence: a name (the scenario's names are those found so).
_NAME_INSIDE = re.compile(r"(?<=[a-z,;:]\s)[A-Z][a-z]+\b")
_NOT_PEOPLE = frozenset(
    "I Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May "
    "June July August September October November December Christmas Easter English French German "
    "Spanish Chinese Indian British American TikTok Instagram WhatsApp Facebook Google Zoom Slack".split()
)
_PRONOUNS = {"she": r"she|her|hers|herself", "he": r"he|him|his|himself"}


def _en_ambiguous(sentence: str, scenario: str, name: str | None, pronoun: str | None) -> bool:
    """Could a pronoun of the persona's gender in ``sentence`` stand for someone else? It
    could when it follows another person's name ("Arjun resigned, writing in his farewell
    email"), unless the scenario shows that person to be of the other gender (a pronoun
    of the other gender follows their name in a sentence: "Tom ... his dedication")."""
    if pronoun not in _PRONOUNS:
        return False
    own = set(" ".join(_en_name_variants(name, scenario)).split()) if name else set()
    other = _PRONOUNS["he" if pronoun == "she" else "she"]
    names = {word for word in _NAME_INSIDE.findall(scenario)} - own - _NOT_PEOPLE
    if not names:
        return False
    for match in re.finditer(rf"\b(?:{'|'.join(sorted(names))})\b", sentence):
        person = match.group(0)
        if not re.search(rf"\b(?:{_PRONOUNS[pronoun]})\b", sentence[match.end() :], re.I):
            continue
        if not re.search(rf"\b{person}\b[^.!?A-Z]*\b(?:{other})\b", scenario):
            return True
    return False


def _en_coordinated_verbs(sentence: str) -> str:
    """After a clause with the subject "I", verbs listed with "and" or commas share it:
    "I avoid the office, skips lunch and lies awake" -> "..., skip lunch and lie awake".
    A word counts as such a verb when it is is/has/does; or ends in -s and, after a
    comma, is followed by a lower-case word other than and/or ("nights and weekends"
    stay), or, after "and", by a determiner, a preposition or a pronoun."""
    start = re.search(r"\bI\b", sentence)
    if start is None:
        return sentence

    def fix(match: re.Match) -> str:
        word, following = match.group(2), match.group(3)
        after_comma = match.group(1).lstrip().startswith(",")
        if (
            word.lower() in _BASE_FORMS
            or following.lower() in _VERB_NEXT
            or following.endswith("ing")
            or (after_comma and following.islower() and following not in ("and", "or"))
        ):
            return match.group(1) + _base_form(word)
        return match.group(1) + word

    head, tail = sentence[: start.end()], sentence[start.end() :]
    tail = re.sub(r"((?:,\s+(?:and\s+)?|\s+and\s+))([a-z]+s|hasn't|doesn't|isn't)(?=\s+([A-Za-z']+))", fix, tail)
    return head + tail


def _en_name_variants(name: str, text: str) -> list[str]:
    """How ``text`` may call the persona, longest first: the full name, the first word,
    the name without its first word ("Mei Lin" for "Tan Mei Lin": family name first),
    and a short form that ends a word of the name ("Seun" for "Oluwaseun")."""
    words = name.split()
    variants = {name, words[0]}
    if len(words) > 1:
        variants.add(" ".join(words[1:]))
    for candidate in set(re.findall(r"\b[A-Z][a-z]{2,}\b", text)):
        if any(word != candidate and word.lower().endswith(candidate.lower()) for word in words):
            variants.add(candidate)
    return sorted(variants, key=len, reverse=True)


def _en_quotes_the_persona(sentence: str, name: str | None) -> bool:
    """Does the persona's name stand right before or inside a quotation ("that Ravi
    'hasn't really listened'")? Someone else's words about them: rewriting them into the
    first person breaks the quote's grammar."""
    if not name:
        return False
    names = "|".join(re.escape(variant) for variant in _en_name_variants(name, sentence))
    return bool(re.search(rf"\b(?:{names})\s+['\"‘“]|['\"‘“][^'\"’”]*\b(?:{names})\b[^'\"’”]*['\"’”]", sentence))


def _en_sentences(persona: Persona, leaks: _LeakCheck) -> list[str]:
    """The scenario's sentences of 4 to 30 words in the first person, without those that
    give the hidden intention away, quote others' words about the persona or hold a
    pronoun that may stand for someone else (:func:`_en_ambiguous`)."""
    second_person = bool(re.match(r"\s*you\b", persona.scenario, re.I))
    pronoun = _en_pronoun(persona)
    result = []
    for sentence in _en_split(persona.scenario):
        if (
            4 <= len(sentence.split()) <= 30
            and not leaks(sentence)
            and not _en_quotes_the_persona(sentence, persona.name)
            and not _en_ambiguous(sentence, persona.scenario, persona.name, pronoun)
        ):
            sentence = _en_first_person(sentence, persona.name, pronoun, second_person)
            result.append(sentence if sentence[-1] in ".!?" else sentence + ".")
    return list(dict.fromkeys(result))


def _en_fragment(state: Sequence[str]) -> str:
    """The state's first clause, 3 to 12 words, lower-cased unless it starts with "I"."""
    if not state:
        return ""
    clause = re.split(r",|;|\s+but\s+|\s+and\s+|\s+because\s+", state[0].rstrip(".!?"), maxsplit=1)[0].strip()
    if not 3 <= len(clause.split()) <= 12:
        return ""
    return clause if clause.startswith(("I ", "I'")) else clause[:1].lower() + clause[1:]


# -- Chinese ---------------------------------------------------------------------------

_ZH_REACTIONS_HEADING = re.compile(
    r"(?i)不同.{0,6}(?:状态|情绪|emotion)|可能的?反应|emotion|情绪反应|角色反应|角色可能|NPC.{0,6}回复"
)
_ZH_SECTIONS = (re.compile(r"事件的?当前状态|当前状态"), re.compile(r"当前面[对临]的问题"))
_ZH_META = ("NPC", "npc", "倾诉", "对话", "交流", "咨询", "聊天", "谈话", "玩家", "隐藏")
_ZH_HEADING_LINE = re.compile(
    r"^\s*(?:#|(?:[-*]\s*|\d+\.\s*)?\*{1,2}[^*]{1,30}\*{1,2}[：:]?\s*$|"
    r"[^。！？，,]{1,20}[：:]\s*$)"
)
#: A list marker or a short heading at the start of a line ("1. ", "2、", "- ",
#: "事件发生之初（3年前）：").
_ZH_LINE_PREFIX = re.compile(
    r"^\s*(?:(?:\d{1,2}|[一二三四五六七八九十])[.、)）]\s*|[-*•·]\s*)?"
    r"(?:[^。！？，,：:]{1,18}[：:]\s*)?"
)
_ZH_LABEL = re.compile(r"\*{1,2}[^*\n]{1,20}\*{1,2}[：:]?")
_ZH_SENTENCE = re.compile(r"[^。！？!?\n]+[。！？!?]?")
_ZH_CONNECTIVES = (
    "但是|而且|并且|于是|所以|因此|因为|虽然|尽管|如果|只是|同时|现在|如今|目前|最近|后来|"
    "当时|那天|今天|昨天|上午|下午|晚上|但|而|却|也|还|就|又|才|便|可"
)
_ZH_TIME_WORD = re.compile(r"^(?:目前|当前|现在|如今|此时|眼下|最近)[，,]\s*")


def _zh_story(scenario: str) -> str:
    """The narrative part of an RLVER scene: cut before the sections on how the user
    reacts (they describe the hidden intention) and before any ``隐藏主题`` tail."""
    scenario = scenario.split("####隐藏主题")[0]
    offset = 0
    for line in scenario.splitlines(keepends=True):
        if offset > 0 and len(line.strip()) < 50 and _ZH_REACTIONS_HEADING.search(line):
            return scenario[:offset]
        offset += len(line)
    return scenario


def _zh_plain(text: str) -> str:
    """Text without markdown headings, bold labels, list markers and short heading
    prefixes, one sentence stream."""
    lines = [
        _ZH_LINE_PREFIX.sub("", line).strip(" -*#\t")
        for line in _ZH_LABEL.sub("", text).splitlines()
        if line.strip() and not _ZH_HEADING_LINE.match(line) and not line.lstrip().startswith("#")
    ]
    return "".join(line if line.endswith(("。", "！", "？", "!", "?")) else line + "。" for line in lines if line)


def _zh_section(story: str, pattern: re.Pattern) -> str:
    """The text under the last heading that matches ``pattern`` ("" when none)."""
    found = list(pattern.finditer(story))
    if not found:
        return ""
    lines: list[str] = []
    for line in story[found[-1].end() :].lstrip("*：: \t）)").splitlines():
        if not line.strip():
            if lines:
                break
            continue
        if lines and _ZH_HEADING_LINE.match(line):
            break
        lines.append(line)
    return _zh_plain("\n".join(lines))


def _zh_pronoun(persona: Persona) -> str | None:
    """她 or 他: from the profile's 性别 (gender) line, else the first of them after the
    name in the profile (then the scenario); ``None`` when neither tells."""
    gender = re.search(r"性别[：:]\s*\**\s*(男|女)", persona.profile)
    if gender:
        return {"男": "他", "女": "她"}[gender.group(1)]
    for text in (persona.profile, persona.scenario):
        start = text.find(persona.name) if persona.name else 0
        found = re.search(r"(?<!其)[她他](?![们人])", text[max(start, 0) :])
        if found:
            return found.group(0)
    return None


def _zh_first_person(sentence: str, name: str | None, pronoun: str | None, about_them: bool) -> str:
    """Replace the persona's name by 我, and their pronoun too when ``about_them`` (the
    sentence names them, or the text has been about them since it last did)."""
    if name:
        sentence = sentence.replace(name, "我")
        if len(name) == 3:
            sentence = sentence.replace(name[1:], "我")
    if pronoun and (about_them or sentence.startswith(pronoun)):
        # A pronoun is safely the persona when it starts a clause ("她回家后", "，但她又")
        # or when the persona is already the clause's subject ("我对……的热情让她");
        # elsewhere it may be someone else ("婆婆……还说她以前").
        clauses = re.split(r"([，,；;：:])", sentence)
        for index in range(0, len(clauses), 2):
            clause = clauses[index]
            starts = re.match(rf"\s*[“\"]?(?:{_ZH_CONNECTIVES})?{pronoun}(?![们人])", clause)
            if starts or ("我" in clause and clause.index("我") < clause.find(pronoun)):
                clauses[index] = re.sub(rf"(?<!其){pronoun}(?![们人])", "我", clause)
        sentence = "".join(clauses)
    sentence = _ZH_COUPLE.sub(r"我们\1", sentence) if "我" in sentence else sentence
    return sentence.replace("我我", "我")


#: "他们的关系" in a sentence about the persona is the persona and someone else: 我们.
_ZH_COUPLE = re.compile(r"(?:他们|她们|两人)(的关系|之间|的问题|的婚姻|的感情|的未来|俩)")
#: A sentence opening with 他们/她们 doing something together is about the persona and
#: someone else, or about others: either way not something to say as "I".
_ZH_THEY_TOGETHER = re.compile(r"^[，,]?(?:(?:近年来|后来|随后|之后|最近)[，,]?)?(?:他们|她们|两人)")


def _zh_sentences(text: str, persona: Persona, leaks: _LeakCheck) -> list[str]:
    """The sentences of ``text`` in the first person, without those about the
    conversation itself or that give the hidden intention away."""
    pronoun = _zh_pronoun(persona)
    result, topic = [], False  # topic: the persona is who the text is about
    for sentence in _ZH_SENTENCE.findall(text):
        sentence = _ZH_TIME_WORD.sub("", sentence.strip())
        named = bool(persona.name) and persona.name in sentence
        first_person = _zh_first_person(sentence, persona.name, pronoun, named or topic)
        topic = named or (topic and bool(pronoun) and pronoun in sentence)
        if not CJK.search(sentence) or any(word in sentence for word in _ZH_META):
            continue
        if leaks(sentence):
            first_person = _zh_clean_prefix(first_person, leaks)
        if _zh_third_person(first_person, persona.name, pronoun) or _ZH_THEY_TOGETHER.match(first_person):
            continue
        if first_person:
            result.append(first_person if first_person[-1] in "。！？!?" else first_person + "。")
    return result


def _zh_third_person(sentence: str, name: str | None, pronoun: str | None) -> bool:
    """Does a rewritten sentence still speak of the persona in the third person, or of
    someone the persona's pronoun may stand for (so the rewriting may be wrong)? It does
    when the name, or the persona's pronoun (not 他们/她们/他人), is left in it, or when
    it holds a time stamp of a list item ("（3年前）")."""
    if name and (name in sentence or (len(name) == 3 and name[1:] in sentence)):
        return True
    if pronoun and re.search(rf"{pronoun}(?![们人])", sentence):
        return True
    return bool(re.search(r"[（(]\s*\d+\s*(?:年|个月|月|周|天)前\s*[）)]", sentence))


def _zh_clean_prefix(sentence: str, leaks: _LeakCheck) -> str:
    """The clauses of a sentence before the first one that gives the intention away
    ("" when fewer than 6 characters remain)."""
    kept = []
    for clause in re.split(r"[，,；;]", sentence.rstrip("。！？!?")):
        if leaks(clause) or any(word in clause for word in _ZH_META):
            break
        kept.append(clause)
    prefix = "，".join(kept)
    return prefix if len(prefix) >= 6 else ""


def _zh_state(persona: Persona, leaks: _LeakCheck) -> list[str]:
    """One or two sentences of the current state (``事件当前状态``, else
    ``当前面对的问题``, else the story's last paragraph), at most about 90 characters."""
    story = _zh_story(persona.scenario)
    sources = [_zh_section(story, pattern) for pattern in _ZH_SECTIONS]
    sources.append(_zh_plain(re.split(r"\n\s*\n", story.strip())[-1]))
    for source in sources:
        sentences = _zh_sentences(source, persona, leaks)
        if sentences:
            chosen = sentences[:1]
            if len(sentences) > 1 and len(chosen[0]) + len(sentences[1]) <= 90:
                chosen.append(sentences[1])
            return chosen
    return []


def _zh_fragment(state: Sequence[str]) -> str:
    """The first clause of the state, 4 to 24 characters ("" otherwise)."""
    if not state:
        return ""
    clause = re.split(r"[，,；;。！？!?]", state[0], maxsplit=1)[0].strip()
    return clause if 4 <= len(clause) <= 24 else ""


#: A told story sentence is cut at a clause boundary to at most this many characters (zh)
#: or words (en): people tell their story in pieces, not in the scene's long sentences.
DETAIL_LIMIT = {"zh": 36, "en": 22}


def _zh_short(sentence: str) -> str:
    """The sentence's leading clauses, at most ``DETAIL_LIMIT["zh"]`` characters, ending
    with 。 ("" when even the first clause is longer)."""
    kept = ""
    for clause in re.split(r"(?<=[，,；;])", sentence.rstrip("。！？!?")):
        if len(kept) + len(clause) > DETAIL_LIMIT["zh"]:
            break
        kept += clause
    return kept.rstrip("，,；;") + "。" if kept else ""


def _zh_details(persona: Persona, leaks: _LeakCheck, state: Sequence[str]) -> tuple[str, ...]:
    """Story sentences of 8 to 60 characters in story order (not the state's), each cut
    to its leading clauses (:func:`_zh_short`)."""
    story = _zh_plain(_zh_story(persona.scenario))
    details = [
        _zh_short(s)
        for s in dict.fromkeys(_zh_sentences(story, persona, leaks))
        if 8 <= len(s) <= 60 and s not in state
    ]
    return tuple(dict.fromkeys(d for d in details if len(d) >= 8))[:MAX_DETAILS]
