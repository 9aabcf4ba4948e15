"""A tiny random chat model, built offline, for tests and smoke runs.

:func:`build_tiny_chat_model` writes a randomly initialised ``Qwen2ForCausalLM`` and a
byte-level BPE tokenizer trained locally on a small corpus of feelings and support
(:func:`tiny_corpus`), speaking ChatML as Qwen2.5 does. Its output is noise: it exists
so that every code path that needs a real causal LM runs without downloading weights.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Special tokens, in id order: pad (``<|endoftext|>``), turn start, turn end (= eos).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Thinking markers: added (never split) but *not* special, as in Qwen3, so that
#: ``skip_special_tokens=True`` keeps them in decoded text.
THINK_TOKENS: tuple[str, ...] = ("<think>", "</think>")

#: ChatML as in Qwen2.5, without the default system prompt. Assistant content sits in
#: ``{% generation %}`` so that ``return_assistant_tokens_mask=True`` works.
CHAT_TEMPLATE: str = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Qwen2's pre-tokenizer split (digits one by one, letters in runs). transformers 5
#: loads any ``model_type="qwen2"`` tokenizer as ``Qwen2Tokenizer``, which installs this
#: split; training with it makes ``AutoTokenizer`` and ``tokenizer.json`` agree.
QWEN2_PRETOKENIZE_REGEX: str = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Version of what a build writes; bump it when the build changes, so old builds are redone.
BUILD_FORMAT = 2

#: The file written last: its presence (with matching settings) marks a complete build.
MARKER = "empathy_gym_tiny.json"

_EN_FEELINGS = (
    "sad",
    "anxious",
    "angry",
    "lonely",
    "tired",
    "hurt",
    "confused",
    "ashamed",
    "overwhelmed",
    "frustrated",
    "hopeful",
    "relieved",
)
_EN_EVENTS = (
    "my boss criticised me in front of everyone",
    "my best friend stopped answering",
    "I failed the exam I studied for",
    "my parents keep comparing me to my cousin",
    "my partner forgot our anniversary",
    "I lost my job last week",
    "my roommate never cleans up",
    "nobody came to my birthday dinner",
)
_EN_REPLIES = (
    "That sounds really hard, and it makes sense that you feel this way.",
    "Thank you for telling me. I am here and I am listening.",
    "It was not your fault. You did what you could with what you knew.",
    "What do you think hurt the most about it?",
    "Would it help to talk through what you could say to them next time?",
    "You showed real courage by speaking up.",
    "I hear how exhausted you are. Take a breath; we can go slowly.",
    "Maybe they acted that way because they were under pressure too.",
    "Let us think about one small step you could take tomorrow.",
    "I am glad you reached out instead of keeping it all inside.",
)
_ZH_FEELINGS = ("难过", "焦虑", "生气", "孤独", "疲惫", "委屈", "迷茫", "羞愧", "崩溃", "失望")
_ZH_EVENTS = (
    "领导当着大家的面批评了我",
    "最好的朋友不回我消息了",
    "我考试没及格",
    "父母总拿我和表哥比较",
    "男朋友忘了我们的纪念日",
    "我上周被裁员了",
)
_ZH_REPLIES = (
    "听起来真的很不容易，你有这样的感受很正常。",
    "谢谢你愿意告诉我，我在这里，认真听你说。",
    "这不是你的错，你已经尽力了。",
    "你觉得这件事里最让你难受的是什么？",
    "要不要一起想想下次可以怎么和他们沟通？",
    "你敢于表达自己，这一点真的很勇敢。",
    "我能感觉到你很累了，慢慢来，不着急。",
    "也许他们那样做，是因为他们自己也有压力。",
)


def _builtin_sentences() -> Iterator[str]:
    """A few hundred fixed sentences (English and Chinese) about feelings and support."""
    for feeling, event in itertools.product(_EN_FEELINGS, _EN_EVENTS):
        yield f"I feel so {feeling} because {event}."
    yield from _EN_REPLIES
    for feeling, event in itertools.product(_ZH_FEELINGS, _ZH_EVENTS):
        yield f"我觉得很{feeling}，因为{event}。"
    yield from _ZH_REPLIES
    yield "<think>The user wants to be heard first.</think>I am listening."
    yield "A B C D E 1 2 3 4 5 yes no +5 +10 -5 -10 emotion: 40"


def tiny_corpus() -> list[str]:
    """The tokenizer's training corpus, in a fixed order: the fixed sentences of this module,
    then the text of the built-in persona bank and of the first 50 RLVER profiles where
    those banks load, so the corpus (and so the tokenizer) changes with the shipped banks.
    """
    corpus = list(_builtin_sentences())
    from empathy_gym.personas import load_personas

    for source, limit in ((None, None), ("rlver", 50)):
        try:
            personas = load_personas(source)[:limit]
        except (OSError, ValueError, KeyError):
            continue
        for persona in personas:
            corpus.extend(text for text in (persona.profile, persona.scenario, persona.opening_line) if text)
    return corpus


def _train_tokenizer(corpus: list[str], vocab_size: int):
    """Train a byte-level BPE ``tokenizers.Tokenizer`` with the ChatML tokens added."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in THINK_TOKENS])
    return tokenizer


def _settings(seed: int, shape: dict[str, int], initializer_range: float, corpus: list[str]) -> dict:
    digest = hashlib.sha256("\n\x00".join(corpus).encode("utf-8")).hexdigest()
    return {
        "format": BUILD_FORMAT,
        "seed": seed,
        **shape,
        "initializer_range": initializer_range,
        "corpus_sha256": digest,
    }


def _built_with(marker: Path, settings: dict) -> bool:
    """True when ``marker`` records a complete build with ``settings``; a marker of other
    settings (or an unreadable one) is removed, so the build starts afresh."""
    if not marker.is_file():
        return False
    try:
        if json.loads(marker.read_text(encoding="utf-8")) == settings:
            return True
    except json.JSONDecodeError:
        pass
    marker.unlink()
    return False


def _tiny_tokenizer(corpus: list[str], vocab_size: int, max_length: int) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(corpus, vocab_size),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>"],
        model_max_length=max_length,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _tiny_model(tokenizer: Any, seed: int, shape: dict[str, int], initializer_range: float) -> Any:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    pad_id, eos_id = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        num_key_value_heads=shape["num_kv_heads"],
        max_position_embeddings=shape["max_position_embeddings"],
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    # Sampling by default, as in instruct checkpoints (Qwen2.5's own config samples too):
    # servers such as `transformers serve` sample only when the model's config says so.
    model.generation_config = GenerationConfig(
        do_sample=True, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return model


def _check_shape(**shape: int) -> None:
    """Refuse a shape Qwen2 cannot take (see :func:`build_tiny_chat_model`'s ValueError)."""
    for name, value in shape.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"build_tiny_chat_model: {name} must be a positive int, got {value!r}")
    hidden_size, num_heads, num_kv_heads = shape["hidden_size"], shape["num_heads"], shape["num_kv_heads"]
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"build_tiny_chat_model: hidden_size ({hidden_size}) must be divisible by "
            f"num_heads ({num_heads}), and num_heads by num_kv_heads ({num_kv_heads})"
        )
    if shape["vocab_size"] < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"build_tiny_chat_model: vocab_size must be >= {256 + len(SPECIAL_TOKENS)} "
            f"(256 bytes + special tokens), got {shape['vocab_size']}"
        )


def build_tiny_chat_model(
    directory: str | os.PathLike,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    initializer_range: float = 0.1,
) -> Path:
    """Build (or reuse) a tiny random ChatML causal LM and its tokenizer in ``directory``.

    The model is a ``transformers.Qwen2ForCausalLM`` with tied embeddings, float32
    weights drawn from N(0, ``initializer_range``) under ``torch.manual_seed(seed)``
    (the global torch RNG is restored afterwards). The tokenizer is byte-level BPE
    trained on :func:`tiny_corpus`, saved as a ``PreTrainedTokenizerFast``:
    ``<|endoftext|>`` (id 0) is the pad token, ``<|im_start|>`` (1) opens a turn,
    ``<|im_end|>`` (2) ends it and is the eos token; ``<think>`` and ``</think>`` are
    added, non-special tokens; any byte string can be encoded (no unknown token). The
    chat template is :data:`CHAT_TEMPLATE`. ``generation_config.json`` sets
    ``do_sample=True``, so ``model.generate()`` without arguments samples.

    Same arguments (and same corpus), same files: the build is deterministic.

    Args:
        directory: where to write (created if needed). When it already holds a complete
            build with the same settings (the marker file :data:`MARKER` is written last),
            it is returned as it is; a build with other settings is overwritten.
        seed: seed for the weights.
        vocab_size: the BPE trainer's target vocabulary, special tokens included; the
            real size may be smaller when the corpus has too few merges. The model's
            vocabulary equals the tokenizer's length.
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
        max_position_embeddings: the Qwen2 shape (``hidden_size`` divisible by
            ``num_heads``, ``num_heads`` by ``num_kv_heads``). The default head size,
            64 / 2 = 32, is the smallest that vLLM's CPU attention accepts.
        initializer_range: std of the random weights; larger than Qwen's 0.02 so that
            the next-token distribution is not flat and greedy decoding is stable.

    Returns:
        ``Path(directory)``, loadable with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``.

    Raises:
        ValueError: a shape argument that Qwen2 cannot take (non-positive, or heads that
            do not divide).
    """
    shape = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
    }
    _check_shape(**shape)
    directory = Path(directory)
    corpus = tiny_corpus()
    settings = _settings(seed, shape, initializer_range, corpus)
    marker = directory / MARKER
    if _built_with(marker, settings):
        return directory
    tokenizer = _tiny_tokenizer(corpus, vocab_size, max_position_embeddings)
    model = _tiny_model(tokenizer, seed, shape, initializer_range)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    marker.write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    return directory
