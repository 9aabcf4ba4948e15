"""Checks of the OpenEnv server (``empathy-gym serve``, empathy_gym/integrations/openenv.py)
against openenv-core 0.3.0's own client, run in a venv layered on the test environment
(tests/test_integration_openenv.py). Each check starts the real server process on
127.0.0.1 and stops it by PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import gymnasium as gym
import pytest

import empathy_gym  # noqa: F401
from empathy_gym.integrations.openenv import EmpathyAction, EmpathyEnvClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the server launcher
from servers import Server, free_port, start  # noqa: E402

REPLIES = ["That sounds really hard. What happened?", "I hear you. You are not alone in this.", "Tell me more."]
PERSONA = "en-002-group-project"


def serve(log: Path, *args: str, env: dict[str, str] | None = None) -> Server:
    """``empathy-gym serve ARGS`` on a free port of 127.0.0.1, ready (tests/servers.py's launcher)."""
    port = free_port()
    command = [sys.executable, "-m", "empathy_gym.cli", "serve", "--port", str(port), *args]
    return start(command, f"http://127.0.0.1:{port}", "", log, {**os.environ, **(env or {})}, timeout_s=120)


def metrics(server: Server, **headers: str) -> dict[str, int]:
    request = urllib.request.Request(f"{server.url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def stop_cleanly(server: Server) -> str:
    """SIGTERM by PID; the server must exit 0 (a clean stop). Returns its log."""
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=60)
    assert server.process.returncode == 0, server.log_tail()
    return server.log_tail(1_000_000)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = serve(tmp_path_factory.mktemp("serve") / "serve.log", "--max-sessions", "8")
    yield running.url, running.process
    stop_cleanly(running)


def in_process(seed: int) -> list[tuple]:
    env = gym.make("EmpathyDialogue-v0")
    text, info = env.reset(seed=seed, options={"persona": PERSONA})
    played = [(text, info["emotion"], None, False)]
    for reply in REPLIES:
        text, reward, terminated, truncated, info = env.step(reply)
        played.append((text, info["emotion"], reward, terminated or truncated))
        if terminated or truncated:
            break
    return played


async def over_the_server(url: str, seed: int) -> list[tuple]:
    async with EmpathyEnvClient(base_url=url) as client:
        result = await client.reset(seed=seed, persona=PERSONA)
        played = [(result.observation.text, result.observation.emotion, result.reward, result.done)]
        for reply in REPLIES:
            result = await client.step(EmpathyAction(utterance=reply))
            played.append((result.observation.text, result.observation.emotion, result.reward, result.done))
            if result.done:
                break
        return played


def test_a_dialogue_over_the_server_is_the_in_process_dialogue(server):
    url, _ = server
    with EmpathyEnvClient(base_url=url).sync() as client:
        result = client.reset(seed=3, persona=PERSONA)
        assert result.observation.persona_id == PERSONA and result.observation.turn == 0
        assert result.observation.messages[-1]["content"] == result.observation.text
        result = client.step(EmpathyAction(utterance=REPLIES[0]))
        assert result.observation.turn == 1 and "emotion_change" in result.observation.info
        assert client.state().step_count == 1 and client.state().persona_id == PERSONA
    assert asyncio.run(over_the_server(url, 3)) == in_process(3)


def test_concurrent_sessions_share_one_user_and_play_their_own_dialogues(server):
    url, _ = server

    async def together():
        return await asyncio.gather(*(over_the_server(url, seed) for seed in range(4)))

    def counted() -> dict[str, int]:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            return json.loads(response.read())

    before = counted()
    played = asyncio.run(together())
    assert played == [in_process(seed) for seed in range(4)]
    after = counted()
    turns = sum(len(dialogue) - 1 for dialogue in played)  # the first entry is the reset's
    assert after["turns_batched"] - before["turns_batched"] == turns
    assert 1 <= after["user_batches"] - before["user_batches"] <= turns


def test_a_step_before_reset_and_a_malformed_action_are_answered_not_fatal(server):
    url, _ = server
    with EmpathyEnvClient(base_url=url).sync() as client:
        with pytest.raises(Exception, match="reset"):
            client.step(EmpathyAction(utterance="hello"))
        result = client.reset(seed=0, persona=PERSONA)  # the session still works
        assert result.observation.emotion > 0
    request = urllib.request.Request(
        f"{url}/step",
        data=json.dumps({"action": {"reply": "x"}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 422 and "utterance" in refused.value.read().decode()
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:  # the server lives on
        assert response.status == 200


def test_the_schema_names_the_typed_action_and_observation(server):
    """OpenEnv 0.3's /schema names its base State whatever the env's (ours travels with its
    fields: the first check reads them through the client)."""
    url, _ = server
    with urllib.request.urlopen(f"{url}/schema", timeout=5) as response:
        schema = json.loads(response.read())
    assert "utterance" in schema["action"]["properties"]
    assert {"text", "emotion", "turn", "persona_id", "messages"} <= set(schema["observation"]["properties"])
    assert {"episode_id", "step_count"} <= set(schema["state"]["properties"])


def post(url: str, payload: bytes, **headers: str) -> tuple[int, str]:
    request = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_a_server_that_holds_under_bad_clients(tmp_path):
    """One server with every guard on: a bearer token, two sessions at most, a 60-character
    action, a 4 kB body, sessions idle for a second expire, finished dialogues logged."""
    log = tmp_path / "dialogues.jsonl"
    token = "t0ken"
    running = serve(
        tmp_path / "serve.log",
        "--max-sessions", "2", "--max-action-chars", "60", "--max-body-bytes", "4096", "--idle-timeout-s", "1",
        "--log-dialogues", str(log), env={"EMPATHY_GYM_SERVE_TOKEN": token},
    )  # fmt: skip
    auth = {"Authorization": f"Bearer {token}"}
    try:
        # the token: 401 without detail, /health open, the client with the token plays
        assert post(f"{running.url}/reset", b"{}") == (401, "")
        assert post(f"{running.url}/reset", b"{}", Authorization="Bearer wrong") == (401, "")
        with urllib.request.urlopen(f"{running.url}/health", timeout=5) as response:
            assert response.status == 200
        with pytest.raises(ConnectionError, match="401"):  # was 403: the handshake is answered with 401 now
            EmpathyEnvClient(base_url=running.url).sync().reset(seed=0)
        # limits, each named; the session goes on after each refusal
        status, body = post(f"{running.url}/reset", b"x" * 5000, **auth)
        assert status == 413 and "over this server's limit of 4096 bytes (--max-body-bytes)" in body
        with EmpathyEnvClient(base_url=running.url, token=token).sync() as client:
            with pytest.raises(Exception, match=r"unknown key\(s\) \['options'\]"):  # was: ignored, another persona
                client.reset(seed=0, options={"persona": PERSONA})
            with pytest.raises(Exception, match="persona must be a persona id"):
                client.reset(seed=0, persona=["a"])
            client.reset(seed=0, persona=PERSONA)
            with pytest.raises(Exception, match=r"over this server's limit of 60 \(--max-action-chars\)"):
                client.step(EmpathyAction(utterance="x" * 61))
            for reply in REPLIES * 5:  # to its end: logged
                if client.step(EmpathyAction(utterance=reply)).done:
                    break
        assert json.loads(log.read_text().splitlines()[0])["persona_id"] == PERSONA
        # a WebSocket message over the body limit closes that session (1009), logged naming the limit
        oversized = EmpathyEnvClient(base_url=running.url, token=token).sync()
        oversized.reset(seed=6)
        with pytest.raises(Exception, match="1009"):
            oversized.step(EmpathyAction(utterance="x" * 5000))
        deadline = time.monotonic() + 30
        while metrics(running, **auth)["sessions_active"] > 0:
            assert time.monotonic() < deadline, metrics(running, **auth)
            time.sleep(0.2)
        # two sessions at most; a client that vanishes mid-dialogue and one left idle free theirs
        first = EmpathyEnvClient(base_url=running.url, token=token).sync()
        first.reset(seed=1)
        second = EmpathyEnvClient(base_url=running.url, token=token).sync()
        second.reset(seed=2)
        with pytest.raises(ConnectionError, match=r"429.*at most 2 sessions \(--max-sessions\)"):
            EmpathyEnvClient(base_url=running.url, token=token).sync().reset(seed=3)
        asyncio.run_coroutine_threadsafe(first.async_client._ws.close(), first._loop).result(10)  # no goodbye
        deadline = time.monotonic() + 30
        while metrics(running, **auth)["sessions_active"] > 0:  # the vanished one and the idle one
            assert time.monotonic() < deadline, metrics(running, **auth)
            time.sleep(0.5)
        with pytest.raises(Exception, match="this session has expired"):  # was: it played on, past the limit
            second.step(EmpathyAction(utterance=REPLIES[0]))
        # a client process killed mid-dialogue: its slot is freed, with no traceback in the log
        killed = "from empathy_gym.integrations.openenv import *; import os\n"
        killed += f"EmpathyEnvClient(base_url={running.url!r}, token={token!r}).sync().reset(seed=5); os._exit(9)"
        assert subprocess.run([sys.executable, "-c", killed], timeout=60).returncode == 9
        while metrics(running, **auth)["sessions_active"] > 0:
            assert time.monotonic() < deadline + 30, metrics(running, **auth)
            time.sleep(0.5)
        with EmpathyEnvClient(base_url=running.url, token=token).sync() as client:
            assert client.reset(seed=4, persona=PERSONA).observation.persona_id == PERSONA
        counts = metrics(running, **auth)
        assert counts["refused_401"] >= 3 and counts["refused_413"] >= 2 and counts["refused_429"] == 1
        assert counts["dialogues_finished"] == 1
    finally:
        output = stop_cleanly(running)
    assert "no valid bearer token" in output and "body over 4096 bytes" in output and "2 sessions open" in output
    assert "the client went away" in output and "Exception in ASGI application" not in output  # was: a traceback
    assert "a message over 4096 bytes (--max-body-bytes)" in output  # was: "the client went away"


def test_a_dead_user_backend_is_a_clear_error_and_the_server_lives_on(tmp_path):
    running = serve(tmp_path / "serve.log", "--user", f"openai:m@http://127.0.0.1:{free_port()}/v1,max_retries=0")
    try:
        with EmpathyEnvClient(base_url=running.url).sync() as client:
            client.reset(seed=0, persona=PERSONA)  # the opening line is the persona's: no call
            with pytest.raises(Exception, match="the simulated user failed") as failed:
                client.step(EmpathyAction(utterance=REPLIES[0]))
            assert "127.0.0.1" in str(failed.value)  # names the server that is gone
        with urllib.request.urlopen(f"{running.url}/health", timeout=5) as response:
            assert response.status == 200
    finally:
        stop_cleanly(running)


def test_a_second_sigterm_stops_a_server_whose_user_hangs(tmp_path):
    """Was: the first SIGTERM waited for the turn running in a worker thread (a model user
    can take minutes; here a server that never answers), and uvicorn's second did too."""
    import threading

    silent = socket.socket()  # takes connections, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    running = serve(
        tmp_path / "serve.log", "--user", f"openai:m@http://127.0.0.1:{silent.getsockname()[1]}/v1,max_retries=0"
    )
    client = EmpathyEnvClient(base_url=running.url).sync()
    client.reset(seed=0, persona=PERSONA)

    def step_until_the_server_goes() -> None:
        with contextlib.suppress(Exception):  # the server's stop ends it
            client.step(EmpathyAction(utterance="hello"))

    threading.Thread(target=step_until_the_server_goes, daemon=True).start()
    time.sleep(2)  # the turn is waiting on the silent server
    running.process.send_signal(signal.SIGTERM)
    time.sleep(2)
    running.process.send_signal(signal.SIGTERM)
    running.process.wait(timeout=20)
    output = running.log_tail()
    assert running.process.returncode == 130, output
    assert "a second SIGTERM: exiting now" in output
    silent.close()


def test_an_empty_token_is_refused_at_start():
    """Was: an empty EMPATHY_GYM_SERVE_TOKEN ran the server open, and --token '' ran one
    nobody could use."""
    from empathy_gym.integrations.openenv import make_app

    for token in ("", "  "):
        with pytest.raises(ValueError, match="token: empty"):
            make_app({"env_id": "EmpathyDialogue-v0"}, token=token)


def test_plain_http_requests_take_no_session_slot():
    """Was: each HTTP /reset built an env that counted as a session, so a loop of them kept
    WebSocket clients out (429). (seed=true still reads as 1: OpenEnv's request model
    coerces it before the env sees it.)"""
    from fastapi.testclient import TestClient

    from empathy_gym.integrations.openenv import ServerLog, make_app

    log = ServerLog()
    log.count("sessions_opened", 3)
    log.count("http_requests_in_flight", 2)  # two HTTP requests, each with its env
    assert log.active_sessions() == 1
    app = make_app({"env_id": "EmpathyDialogue-v0"}, max_sessions=1)
    with TestClient(app) as client:
        assert client.post("/reset", json={"seed": 1}).status_code == 200
        assert client.get("/metrics").json()["sessions_active"] == 0
        with client.websocket_connect("/ws") as session:  # the one slot is free
            session.send_json({"type": "reset", "data": {"seed": 0}})
            assert session.receive_json()["type"] != "error"


# -- the OpenEnv environment folder (deploy/empathy_env) -----------------------------------
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "empathy_env"


def openenv_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv.cli", *args], capture_output=True, text=True, timeout=120)


def test_openenv_validate_passes_the_deployment_folder_and_fails_one_without_its_lock(tmp_path):
    """OpenEnv's offline checks of a folder that ``openenv build`` and ``openenv push`` take:
    ``openenv validate`` (manifest, pyproject's ``server`` script, lock, ``server/app.py``'s
    guarded ``main``) and push's structure check."""
    from openenv.cli._cli_utils import validate_env_structure

    passed = openenv_cli("validate", str(DEPLOY), "--json", "--verbose")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    report = json.loads(passed.stdout)
    assert report["passed"] and report["deployment_modes"] == {
        "docker": True,
        "openenv_serve": True,
        "uv_run": True,
        "python_module": True,
    }
    assert validate_env_structure(DEPLOY) == ["Recommended directory missing: outputs/"]

    unlocked = tmp_path / "empathy_env"
    shutil.copytree(DEPLOY, unlocked, ignore=shutil.ignore_patterns("uv.lock", "vendor", "__pycache__"))
    failed = openenv_cli("validate", str(unlocked))
    assert failed.returncode == 1 and "Missing uv.lock" in failed.stdout


def test_the_deployment_app_reads_serve_options_from_variables_and_passes_runtime_validation(tmp_path):
    """``python -m server.app`` (the Dockerfile's command) serves ``empathy-gym serve``'s app
    with its options from ``EMPATHY_GYM_SERVE_*`` (here the port and the persona bank: a
    reset draws the persona that ``gym.make(personas="sage")`` draws with the same seed),
    ``openenv validate --url`` passes every criterion, and SIGTERM stops it with exit code 0."""
    port = free_port()
    variables = {"PYTHONPATH": str(DEPLOY), "EMPATHY_GYM_SERVE_PORT": str(port), "EMPATHY_GYM_SERVE_PERSONAS": "sage"}
    command = [sys.executable, "-m", "server.app"]
    bad = {**os.environ, **variables, "EMPATHY_GYM_SERVE_PERSONAS": "nosuch"}
    refused = subprocess.run(command, env=bad, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and refused.stderr.startswith("error: no persona bank 'nosuch'"), refused.stderr
    assert "Traceback" not in refused.stderr  # was: a traceback of the import
    running = start(command, f"http://127.0.0.1:{port}", "", tmp_path / "app.log", {**os.environ, **variables}, 120)
    try:

        async def persona_of_reset(seed: int) -> str:
            async with EmpathyEnvClient(base_url=running.url) as client:
                return (await client.reset(seed=seed)).observation.persona_id

        in_process = gym.make("EmpathyDialogue-v0", personas="sage").reset(seed=3)[1]["persona_id"]
        assert asyncio.run(persona_of_reset(3)) == in_process
        assert in_process != gym.make("EmpathyDialogue-v0").reset(seed=3)[1]["persona_id"]

        runtime = openenv_cli("validate", "--url", running.url)
        report = json.loads(runtime.stdout)
        assert runtime.returncode == 0 and report["passed"], runtime.stdout
        assert report["mode"] == "simulation" and report["summary"]["failed_criteria"] == []
    finally:
        log = stop_cleanly(running)
    assert "Application shutdown complete" in log


# -- TRL's environment path (environment_factory) over the server --------------------------
SAID = "I hear you."
TOOL_CALL = "<tool_call>\n" + json.dumps({"name": "reply", "arguments": {"message": SAID}}) + "\n</tool_call><|im_end|>"


def teach_the_tool_call(model, tokenizer, contexts: list[str], steps: int) -> float:
    """Fit the tiny random model to answer every context with :data:`TOOL_CALL` (a random
    model never calls a tool; a 7B instruct model does). Returns the last loss."""
    import torch

    rows = []
    for context in contexts:
        prompt = tokenizer(context, add_special_tokens=False)["input_ids"]
        target = tokenizer(TOOL_CALL, add_special_tokens=False)["input_ids"]
        rows.append((prompt + target, [-100] * len(prompt) + target))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows])
    mask = (ids != 0).long()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def test_a_grpo_step_through_trl_environment_factory_plays_the_server_dialogues(tmp_path, tiny_model_dir):
    """TRL's native environment path, as ``examples/trl_openenv.py`` runs it:
    ``GRPOTrainer(environment_factory=...)`` with :class:`EmpathyToolEnv` on the real
    server. The tiny model (taught first to call the ``reply`` tool) speaks through the tool;
    every rollout's turns are the in-process dialogue of its row's seed and persona (same
    user lines, same emotions), and the reward TRL logs is the mean of their returns."""
    import importlib.util

    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from empathy_gym.integrations.trl_environment import EmpathyToolEnv

    spec = importlib.util.spec_from_file_location("trl_openenv", DEPLOY.parents[1] / "examples" / "trl_openenv.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    running = serve(tmp_path / "serve.log")
    try:
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        teacher, contexts = EmpathyToolEnv(running.url), []
        for row in EmpathyToolEnv.dataset(running.url, 2, seed=0):
            chat = [dict(message) for message in row["prompt"]]
            chat[-1]["content"] = teacher.reset(**row)
            for _ in range(2):
                contexts.append(
                    tokenizer.apply_chat_template(
                        chat, tools=[teacher.reply], add_generation_prompt=True, tokenize=False
                    )
                )
                call = {"type": "function", "function": {"name": "reply", "arguments": {"message": SAID}}}
                answer = teacher.reply(SAID)
                chat += [
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": answer},
                ]
        assert teach_the_tool_call(model, tokenizer, contexts, steps=80) < 0.1

        argv = ["--url", running.url, "--steps", "1", "--prompts", "2", "--generations", "2", "--max-turns", "2"]
        argv += ["--max-completion-length", "200", "--output-dir", str(tmp_path / "grpo")]
        trainer = example.main(argv, model=model, tokenizer=tokenizer)
    finally:
        stop_cleanly(running)

    played = trainer.environments
    assert len(played) == 2 and all(len(env.emotions) >= 2 for env in played), "the policy spoke through the tool"
    for env in played:
        local = gym.make("EmpathyDialogue-v0")
        text, info = local.reset(seed=env.env_seed, options={"persona": env.persona_id})
        lines, emotions, total = [text], [info["emotion"]], 0.0
        for _ in env.emotions[1:]:
            text, reward, *_, info = local.step(SAID)
            lines.append(text)
            emotions.append(info["emotion"])
            total += reward
        assert (env.user_lines, env.emotions) == (lines, emotions)
        assert env.episode_return == pytest.approx(total)
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] > 0
    assert logged["rewards/EmpathyToolEnv/mean"] == pytest.approx(sum(e.episode_return for e in played) / 2, abs=1e-6)


def test_a_port_in_use_is_an_error_naming_it_exit_1(server, tmp_path):
    """Before: uvicorn's exit code 3, outside the command line's codes. Now: 1, with the
    address, after uvicorn's own line saying why."""
    port = server[0].rsplit(":", 1)[1]
    command = [sys.executable, "-m", "empathy_gym.cli", "serve", "--port", port]
    second = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert "address already in use" in second.stderr + second.stdout
    assert f"the server did not start on 127.0.0.1:{port}" in second.stderr + second.stdout


def test_non_finite_numbers_get_a_422_not_a_500(server):
    """Before: FastAPI's own 422 handler failed to echo ``1e400`` or ``NaN`` back as JSON (a
    500, found by a probe)."""
    url, _ = server
    for body in (b'{"seed": 1e400}', b'{"seed": NaN}'):
        status, text = post(f"{url}/reset", body)
        assert status == 422, (body, status, text)
        assert json.loads(text)["detail"][0]["input"] in ("inf", "nan") and "finite number" in text


def test_an_unwritable_dialogue_log_is_refused_at_start(tmp_path):
    """Before: a folder (or a path the server cannot write) was taken, and the last turn of
    every dialogue failed (found by a probe). Now the server refuses to start, naming it."""
    command = [sys.executable, "-m", "empathy_gym.cli", "serve", "--port", str(free_port())]
    started = subprocess.run([*command, "--log-dialogues", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert started.returncode == 1
    assert f"--log-dialogues {tmp_path}: cannot append to it (Is a directory)" in started.stdout + started.stderr


def test_the_tool_env_outlives_an_expired_session_a_restart_and_a_failed_reset(tmp_path):
    """Before: an ``EmpathyToolEnv`` that TRL keeps across batches failed for good once its
    session expired or its server restarted, and a failed reset left the last dialogue
    playable (found by a probe). Now every reset opens a new session."""
    from empathy_gym.integrations.trl_environment import EmpathyToolEnv

    running = serve(tmp_path / "serve.log", "--idle-timeout-s", "1")
    try:
        env = EmpathyToolEnv(running.url)
        opening = env.reset(env_seed=0)
        env.reply(REPLIES[0])
        time.sleep(4)  # the session expires
        assert env.reset(env_seed=0) == opening and env.emotions == [env.emotions[0]]
        with pytest.raises(RuntimeError, match="unknown persona"):
            env.reset(env_seed=0, persona_id="nope")
        assert env.done and env.user_lines == [] and env.get_reward() == 0.0
        with pytest.raises(ValueError, match="the conversation has ended"):
            env.reply(REPLIES[0])
        running.restart(timeout_s=120)
        assert env.reset(env_seed=0) == opening
        env.reply(REPLIES[0])
        assert len(env.emotions) == 2
    finally:
        running.stop()
