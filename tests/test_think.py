from empathy_gym.think import split_think


def test_well_formed():
    s = split_think("  <think>He feels dismissed.\nValidate first.</think>\n That sounds unfair.")
    assert s.thinking == "He feels dismissed.\nValidate first."
    assert s.reply == "That sounds unfair."
    assert s.error is None


def test_missing_block_passes_text_through():
    s = split_think("That sounds unfair.")
    assert (s.thinking, s.reply, s.error) == ("", "That sounds unfair.", "missing_think")


def test_unclosed_block_reaches_nobody():
    s = split_think("<think>I should say something kind")
    assert (s.thinking, s.reply, s.error) == ("I should say something kind", "", "unclosed_think")


def test_later_blocks_and_stray_tags_are_removed_from_reply():
    s = split_think("<think>a</think>Hi <think>secret</think>there</think>")
    assert s.reply == "Hi there"
    assert "secret" not in s.reply


def test_unclosed_block_after_reply_is_cut():
    s = split_think("<think>a</think>Hello.<think>plan the next")
    assert s.reply == "Hello." and s.error is None
