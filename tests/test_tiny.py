"""The tiny random chat model: tokens, chat template, caching and determinism."""

from __future__ import annotations

import json

import pytest

from empathy_gym.backends.tiny import MARKER, build_tiny_chat_model


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_special_tokens_have_fixed_ids(tiny_tokenizer):
    ids = tiny_tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [0, 1, 2]
    assert (tiny_tokenizer.pad_token_id, tiny_tokenizer.eos_token_id) == (0, 2)


def test_chat_template_is_chatml(tiny_tokenizer):
    conversation = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "I feel sad."},
        {"role": "assistant", "content": "I hear you."},
        {"role": "user", "content": "我很难过"},
    ]
    text = tiny_tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe kind.<|im_end|>\n"
        "<|im_start|>user\nI feel sad.<|im_end|>\n"
        "<|im_start|>assistant\nI hear you.<|im_end|>\n"
        "<|im_start|>user\n我很难过<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tiny_tokenizer.apply_chat_template(conversation[:2], tokenize=False)
    assert without == "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nI feel sad.<|im_end|>\n"


def test_assistant_mask_covers_the_reply_and_its_end_token(tiny_tokenizer):
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    encoded = tiny_tokenizer.apply_chat_template(conversation, return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = encoded["input_ids"], encoded["assistant_masks"]
    trained = [token for token, keep in zip(ids, mask) if keep]
    assert tiny_tokenizer.decode(trained) == "ok<|im_end|>"


def test_think_tokens_are_single_and_survive_skip_special_tokens(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<think>", add_special_tokens=False)
    assert len(ids) == 1
    text = "<think>plan</think>I am here."
    decoded = tiny_tokenizer.decode(tiny_tokenizer.encode(text), skip_special_tokens=True)
    assert decoded == text


@pytest.mark.parametrize("text", ["A", "B", "C", "D", "E"])
def test_option_letters_are_one_token(tiny_tokenizer, text):
    assert len(tiny_tokenizer.encode(text, add_special_tokens=False)) == 1


def test_text_round_trips_in_both_languages(tiny_tokenizer):
    for text in ["I'm fine, 12345 times.\n\n  ok", "我觉得很委屈，因为朋友不回我消息。😀"]:
        assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text


def test_model_shape(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("qwen2", 64, 2)
    assert config["vocab_size"] == 2050  # 2048 BPE entries (3 special) + <think> + </think>
    assert (config["eos_token_id"], config["pad_token_id"]) == (2, 0)


def test_second_call_reuses_the_build(tiny_model_dir):
    weights = tiny_model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_tiny_chat_model(tiny_model_dir) == tiny_model_dir
    assert weights.stat().st_mtime_ns == before


def test_build_is_deterministic(tiny_model_dir, tmp_path):
    again = build_tiny_chat_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", MARKER):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_bad_shape_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="num_heads"):
        build_tiny_chat_model(tmp_path, hidden_size=60, num_heads=8)
