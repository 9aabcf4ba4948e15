"""The shipped distilled appraiser (issue 36) on SmolLM2-135M-Instruct: built from an empty
model cache it gives the pinned appraisals; bad replies score below a plain caring reply
in contexts it never trained on; the user's replies fit its changes."""

from __future__ import annotations

import pytest

from empathy_gym.personas import builtin_bank
from empathy_gym.user.base import UserRequest
from empathy_gym.user.distill_rows import english_bank_split
from empathy_gym.user.probes import BAD_KINDS, below_caring

pytestmark = pytest.mark.slow

#: The shipped appraiser's mean change for three replies to the opening of en-005 (the first
#: held-out English persona), measured when the head was committed (benchmarks/distill_appraiser.py).
PINNED: dict[str, float] = {
    "That sounds really painful. What happened after that?": 1.276,
    "Just get over it.": -8.652,
    "You're amazing! You are so strong!": -5.679,
}


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The shipped distilled user, its base model converted into an empty cache."""
    import os

    from empathy_gym.user.distilled_user import DistilledUser

    cache = tmp_path_factory.mktemp("empty-cache")
    old = os.environ.get("EMPATHY_GYM_CACHE")
    os.environ["EMPATHY_GYM_CACHE"] = str(cache)
    try:
        built = DistilledUser()
        assert (cache / "smollm2-135m-instruct").is_dir()
        yield built
    finally:
        if old is None:
            del os.environ["EMPATHY_GYM_CACHE"]
        else:
            os.environ["EMPATHY_GYM_CACHE"] = old


def openings(user, personas):
    return [UserRequest(p, (("user", user.opening([p], [0])[0]),), "", 40, 1) for p in personas]


def test_bad_replies_score_below_a_caring_reply_in_contexts_it_never_trained_on(user, measured):
    """The 16 English personas held out of its training and the 8 Chinese ones (SAGE's
    logs are other profiles), at their opening: every kind of bad reply scores below a
    plain caring reply in at least 95% of them (the rule user: about two in three)."""
    contexts = openings(user, [*english_bank_split(0)[1], *builtin_bank("zh")])
    shares = below_caring(user, contexts)
    measured(f"distilled user, bad replies below a caring one: {shares['all']:.3f}")
    assert all(shares[kind] >= 0.95 for kind in BAD_KINDS), shares


def test_the_shipped_appraiser_gives_the_pinned_appraisals(user):
    """Same weights, same appraisals: the head in the repository on SmolLM2 converted into
    an empty cache gives the means measured when it was committed."""
    persona = english_bank_split(0)[1][0]
    assert persona.id == "en-005-sister-wedding-loan"
    [opening] = openings(user, [persona])
    appraisals = user.appraise([UserRequest(persona, opening.history, reply, 40, 1) for reply in PINNED])
    expected = [appraisal.features["expected"] for appraisal in appraisals]
    assert expected == pytest.approx(list(PINNED.values()), abs=2e-3)
    assert [appraisal.change for appraisal in appraisals] == [1, -9, -6]
