"""GPU benchmark: a Qwen2.5-7B-shaped policy with LoRA, one PPO update, on one GPU.

    python benchmarks/gpu_qwen7b_lora.py                 # on a CUDA machine
    python benchmarks/gpu_qwen7b_lora.py --small --device cpu   # a shape check anywhere

No weights can be downloaded, so the model is built with random weights from
Qwen2.5-7B-Instruct's configuration (28 layers, hidden 3584, 28 heads / 4 KV heads,
MLP 18944, vocabulary 152064) in bfloat16. Timing and memory do not depend on the
weights' values. The rollout is replaced by synthetic dialogues of RLVER's shape
(prompt, then alternating agent and user turns; only agent tokens trainable), so the
numbers are those of the update phase (old log-probs and values, then PPO epochs),
plus a separate measure of ``generate`` throughput.

Prints one table: per configuration (gradient checkpointing on and off), seconds per
update, trainable tokens per second and peak GPU memory.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

QWEN25_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
SMALL = dict(
    QWEN25_7B,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
)


class _FakeTokenizer:
    """Just enough tokenizer for the trainer's update phase (pad and eos ids)."""

    pad_token = eos_token = "<|im_end|>"
    pad_token_id = eos_token_id = 2

    def save_pretrained(self, path):  # not called: the benchmark never checkpoints
        pass


def synthetic_trajectories(n: int, turns: int, prompt_len: int, agent_len: int, user_len: int, vocab: int, seed: int):
    from empathy_gym.agents.rollout import Trajectory

    g = torch.Generator().manual_seed(seed)
    out = []
    for key in range(n):
        t = Trajectory(
            key=key,
            group=key,
            env_seed=key,
            persona_id="p",
            language="zh",
            hidden_intention="deep_empathy",
            character_type="passive",
            emotions=[30],
        )
        t.extend(torch.randint(3, vocab, (prompt_len,), generator=g).tolist(), trainable=False)
        for turn in range(turns):
            t.extend(torch.randint(3, vocab, (agent_len,), generator=g).tolist(), trainable=True)
            t.turn_ends.append(len(t.token_ids) - 1)
            t.rewards.append(0.05)
            if turn < turns - 1:
                t.extend(torch.randint(3, vocab, (user_len,), generator=g).tolist(), trainable=False)
        out.append(t)
    return out


def run(args: argparse.Namespace, checkpointing: bool) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from empathy_gym.agents import PPOConfig, PPOTrainer
    from empathy_gym.agents.config import PolicyConfig

    device = torch.device(args.device)
    shape = SMALL if args.small else QWEN25_7B
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(dtype)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    config = PPOConfig(
        rollout_batch_size=args.batch,
        num_mini_batches=args.mini_batches,
        gradient_accumulation_steps=args.accumulation,
        learning_rate=1e-5,
        critic_learning_rate=1e-5,
        report_to="none",
        progress=False,
        policy=PolicyConfig(
            model="<random>",
            device=str(device),
            use_lora=True,
            lora_r=64,
            lora_alpha=128,
            gradient_checkpointing=checkpointing,
        ),
    )
    trainer = PPOTrainer.__new__(PPOTrainer)  # the update phase only: no envs, no generator
    trainer.config, trainer.device, trainer.tokenizer = config, device, _FakeTokenizer()
    trainer.base_model_name, trainer.reference = "<random>", None
    trainer.model = trainer._wrap_policy(model)
    trainer._build_algorithm()
    trainer.optimizer = torch.optim.AdamW(trainer.param_groups(), weight_decay=0.0)
    trajectories = synthetic_trajectories(
        args.batch, args.turns, args.prompt_len, args.agent_len, args.user_len, shape["vocab_size"], seed=0
    )
    trainable = sum(sum(t.loss_mask) for t in trajectories)
    trainer.update(trajectories, step=1)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(2, 2 + args.repeats):
        trainer.update(trajectories, step=step)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.repeats
    row = {
        "checkpointing": checkpointing,
        "s_per_update": seconds,
        "trainable_tok_per_s": trainable / seconds,
        "sequence_len": len(trajectories[0].token_ids),
        "peak_gib": float("nan"),
    }

    prompt = trajectories[0].token_ids[: args.prompt_len]
    inputs = torch.tensor([prompt] * args.batch, device=device)
    trainer.model.eval()
    with torch.no_grad():
        start = time.perf_counter()
        trainer.model.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            do_sample=True,
            max_new_tokens=args.agent_len,
            min_new_tokens=args.agent_len,
            pad_token_id=2,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        row["generate_tok_per_s"] = args.batch * args.agent_len / (time.perf_counter() - start)
    if device.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del trainer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="a 2-layer model of the same family (shape check)")
    parser.add_argument("--batch", type=int, default=8, help="dialogues per update")
    parser.add_argument("--mini-batches", type=int, default=2)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8, help="agent turns per dialogue (RLVER: 8)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--agent-len", type=int, default=128)
    parser.add_argument("--user-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"device {args.device} ({gpu}); torch {torch.__version__}; {platform.machine()}")
    print(
        f"shape: {'small' if args.small else 'Qwen2.5-7B'}; LoRA r=64 on all linear layers; bf16 on GPU; "
        f"{args.batch} dialogues x {args.turns} turns"
    )
    rows = [run(args, checkpointing) for checkpointing in (True, False)]
    header = f"{'grad ckpt':>10}{'seq len':>9}{'s/update':>10}{'train tok/s':>13}{'gen tok/s':>11}{'peak GiB':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{str(r['checkpointing']):>10}{r['sequence_len']:>9}{r['s_per_update']:>10.2f}"
            f"{r['trainable_tok_per_s']:>13.0f}{r['generate_tok_per_s']:>11.1f}{r['peak_gib']:>10.1f}"
        )


if __name__ == "__main__":
    main()
