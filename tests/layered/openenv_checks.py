"""Checks of the OpenEnv server (``empathy-gym serve``, empathy_gym/integrations/openenv.py)
against openenv-core 0.3.0's own client, run in a venv layered on the test environment
(tests/test_integration_openenv.py). Each check starts the real server process on
127.0.0.1 and stops it by PID."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import gymnasium as gym
import pytest

import empathy_gym  # noqa: F401
from empathy_gym.integrations.openenv import EmpathyAction, EmpathyEnvClient

REPLIES = ["That sounds really hard. What happened?", "I hear you. You are not alone in this.", "Tell me more."]
PERSONA = "en-002-group-project"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "empathy_gym.cli", "serve", "--port", str(port), "--max-sessions", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"the server did not start: {process.communicate()[0][-3000:]}")
            time.sleep(0.3)
    yield url, process
    process.send_signal(signal.SIGTERM)  # by PID: stops cleanly
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output[-3000:]


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

    assert asyncio.run(together()) == [in_process(seed) for seed in range(4)]


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
