"""TransformersBackend on the tiny random model (CPU)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from empathy_gym.backends import BackendError, make_backend
from empathy_gym.backends.transformers_backend import TransformersBackend

SHORT = [{"role": "user", "content": "Hi"}]
MEDIUM = [{"role": "user", "content": "I feel sad because my best friend stopped answering."}]
LONG = [
    {"role": "system", "content": "You are a kind listener."},
    {"role": "user", "content": "我觉得很难过，因为领导当着大家的面批评了我。"},
    {"role": "assistant", "content": "听起来真的很不容易。"},
    {"role": "user", "content": "是的，我一整天都很委屈，不知道该怎么办。"},
]
BATCH = [MEDIUM, LONG, SHORT]


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    with TransformersBackend(tiny_model_dir, device="cpu") as built:
        yield built


def test_is_built_by_name(tiny_model_dir):
    built = make_backend("transformers", model=str(tiny_model_dir), max_batch_size=2)
    assert isinstance(built, TransformersBackend)
    assert (built.name, built.supports_seed, built.max_batch_size) == ("transformers", True, 2)
    assert built.model.dtype == torch.float32 and built.device.type == "cpu"


def test_batch_gives_one_string_per_conversation(backend):
    texts = backend.generate(BATCH, max_tokens=8, temperature=0)
    assert len(texts) == 3 and all(isinstance(text, str) for text in texts)
    assert not any("<|im_end|>" in text or "<|endoftext|>" in text for text in texts)


def test_greedy_is_the_same_alone_and_in_a_left_padded_batch(backend):
    # Exact equality holds on this model: left padding with the attention mask and
    # position ids from the mask leaves the real tokens' logits unchanged up to float
    # noise far below the gap between the top two tokens.
    in_batch = backend.generate(BATCH, max_tokens=12, temperature=0)
    alone = [backend.generate([conversation], max_tokens=12, temperature=0)[0] for conversation in BATCH]
    assert in_batch == alone


def test_greedy_ignores_seeds(backend):
    first = backend.generate([MEDIUM], max_tokens=8, temperature=0, seeds=[1])
    assert backend.generate([MEDIUM], max_tokens=8, temperature=0, seeds=[2]) == first


def test_same_seeds_same_samples_other_seeds_other_samples(backend):
    sample = dict(max_tokens=16, temperature=1.0, top_p=0.95)
    first = backend.generate(BATCH, seeds=[1, 2, 3], **sample)
    assert backend.generate(BATCH, seeds=[1, 2, 3], **sample) == first
    # The untrained model's next-token distribution is broad: 16 draws with other
    # seeds coincide with probability ~0.
    assert backend.generate(BATCH, seeds=[4, 5, 6], **sample) != first


def test_a_seed_belongs_to_its_conversation_not_to_the_batch(backend):
    sample = dict(max_tokens=16, temperature=1.0)
    in_batch = backend.generate(BATCH, seeds=[1, 2, 3], **sample)
    assert backend.generate([LONG], seeds=[2], **sample) == [in_batch[1]]
    # max_batch_size=16 holds all three; chunking by 2 must not change anything either.
    backend.max_batch_size = 2
    try:
        assert backend.generate(BATCH, seeds=[1, 2, 3], **sample) == in_batch
    finally:
        backend.max_batch_size = 16


def test_none_seeds_follow_the_global_torch_rng(backend):
    torch.manual_seed(7)
    first = backend.generate([SHORT, SHORT], max_tokens=12, temperature=1.0)
    torch.manual_seed(7)
    assert backend.generate([SHORT, SHORT], max_tokens=12, temperature=1.0) == first


def test_choice_logprobs_equal_a_plain_forward_pass(backend):
    options = ["A", "B", "C", "D", "E"]
    scores = backend.choice_logprobs(BATCH, options)
    assert scores.shape == (3, 5) and scores.dtype == np.float64
    assert np.isfinite(scores).all() and (np.exp(scores).sum(axis=1) <= 1).all()

    tokenizer = backend.tokenizer
    option_ids = [tokenizer.convert_tokens_to_ids(letter) for letter in options]
    for row, conversation in enumerate(BATCH):  # unpadded, one at a time
        ids = tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        assert tokenizer.decode(ids[0]).endswith("<|im_end|>\n<|im_start|>assistant\n")
        with torch.no_grad():
            logits = backend.model(input_ids=ids).logits[0, -1]
        expected = torch.log_softmax(logits.double(), dim=-1)[option_ids].numpy()
        np.testing.assert_allclose(scores[row], expected, rtol=0, atol=1e-5)


def test_choice_logprobs_rejects_options_sharing_a_first_token(backend):
    with pytest.raises(ValueError, match="share a first token"):
        backend.choice_logprobs([SHORT], ["Yes, surely", "Yes, maybe"])


def test_seeds_must_match_the_batch(backend):
    with pytest.raises(ValueError, match="2 seeds for 3 conversations"):
        backend.generate(BATCH, seeds=[1, 2])


def test_a_loaded_model_object_is_accepted(backend):
    wrapped = TransformersBackend(backend.model, backend.tokenizer)
    assert wrapped.device == backend.device
    assert wrapped.generate([MEDIUM], max_tokens=8, temperature=0) == backend.generate(
        [MEDIUM], max_tokens=8, temperature=0
    )
    with pytest.raises(ValueError, match="tokenizer="):
        TransformersBackend(backend.model)


def test_a_missing_model_names_its_source(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(BackendError, match="no-such-model"):
        TransformersBackend(str(missing))


def test_a_gguf_path_loads_from_its_directory(monkeypatch, backend, tmp_path):
    calls = []
    gguf = tmp_path / "smol" / "SmolLM2.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.touch()

    def fake_from_pretrained(returned):
        def load(source, **kwargs):
            calls.append((source, kwargs.get("gguf_file")))
            return returned

        return load

    from empathy_gym.backends import transformers_backend as module

    monkeypatch.setattr(module.AutoTokenizer, "from_pretrained", fake_from_pretrained(backend.tokenizer))
    monkeypatch.setattr(module.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained(backend.model))
    TransformersBackend(str(gguf), device="cpu")
    assert calls == [(str(gguf.parent), "SmolLM2.Q4_1.gguf")] * 2


def test_close_is_idempotent(tiny_model_dir):
    built = TransformersBackend(tiny_model_dir, device="cpu")
    built.close()
    built.close()
    assert built.model is None


@pytest.mark.parametrize("name", ["/nonexistent/model", "./missing", "missing/sub/dir", "missing.gguf"])
def test_a_missing_local_path_is_named_not_taken_for_a_hub_id(name):
    with pytest.raises(BackendError, match=rf"model '{re.escape(name)}': no such file or folder"):
        TransformersBackend(name)
