"""The verifiers environment against verifiers' own machinery (verifiers 0.4.0, on PyPI now).

Not collected by the main test run (the file name does not start with ``test_``):
``tests/test_integration_verifiers.py`` runs it with pytest inside a layered venv that has
verifiers (``tests/layered_venv.py``), and fails unless every check here passes.

Everything verifiers does runs for real: its env lifecycle (``serving``, ``run_episode``),
the interception server, the tool-less ``null`` harness (a chat program that verifiers
prepares with ``uv``) in a subprocess runtime, its eval client and, in the last check,
the ``vf-eval`` command line. Only the model is a stub: a local OpenAI-compatible endpoint
that answers the k-th turn of every dialogue with ``REPLIES[k - 1]`` and records the
requests.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest
import verifiers.v1 as vf

import empathy_gym  # noqa: F401
from empathy_gym.integrations import verifiers as evf  # after verifiers: needs it
from empathy_gym.integrations.dialogues import close_shared
from empathy_gym.personas import load_personas
from empathy_gym.user.scripted import ScriptedUser

EN = [p.id for p in load_personas("en")]
REPLIES = ["That sounds really hard.", "You did your part, and it still hurt.", "What would help you most right now?"]


def text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


class StubModel:
    """A local OpenAI-compatible chat endpoint (streaming or not) whose reply to a
    conversation with k user messages is ``REPLIES[k - 1]``."""

    def __init__(self):
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                turn = sum(1 for m in body["messages"] if m["role"] == "user")
                reply = REPLIES[(turn - 1) % len(REPLIES)]
                base = {
                    "id": f"chatcmpl-{len(stub.requests)}",
                    "created": int(time.time()),
                    "model": body.get("model", "stub"),
                }
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                if body.get("stream"):
                    chunk = {**base, "object": "chat.completion.chunk"}
                    events = [
                        {
                            **chunk,
                            "choices": [
                                {"index": 0, "finish_reason": None, "delta": {"role": "assistant", "content": reply}}
                            ],
                        },
                        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                    ]
                    if (body.get("stream_options") or {}).get("include_usage"):
                        events.append({**chunk, "choices": [], "usage": usage})
                    data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
                    data += b"data: [DONE]\n\n"
                    content_type = "text/event-stream"
                else:
                    data = json.dumps(
                        {
                            **base,
                            "object": "chat.completion",
                            "usage": usage,
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": reply},
                                }
                            ],
                        }
                    ).encode()
                    content_type = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def context(self) -> vf.ModelContext:
        return vf.ModelContext(
            model="stub", client=vf.EvalClientConfig(base_url=self.url, api_key_var="EMPATHY_GYM_STUB_KEY")
        )

    def close(self):
        self.server.shutdown()


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv("EMPATHY_GYM_STUB_KEY", "stub")
    model = StubModel()
    yield model
    model.close()
    close_shared()


def play(env, stub, tasks):
    async def main():
        async with env.serving():
            return await asyncio.gather(*(env.run_episode(task, stub.context()) for task in tasks))

    return asyncio.run(main())


def test_one_episode_with_hand_worked_rewards(stub):
    """ScriptedUser proposes +10, -5, +20 (RLVER protocol: e_0 = 30, unclamped): emotions
    40, 35, 55; the emotion change is 0.25, the final emotion 0.55; max_turns=3 ends it."""
    seen = []
    user = ScriptedUser(change_fn=lambda r: (seen.append(r.utterance), [10, -5, 20][r.turn - 1])[1])
    env = evf.load_environment(
        "EmpathyDialogue-v0",
        persona_ids=[EN[0]],
        seed=3,
        personas="en",
        protocol="rlver_training",
        max_turns=3,
        user=user,
    )
    (task,) = list(env.taskset)
    reference = gym.make("EmpathyDialogue-v0", personas="en", protocol="rlver_training")
    opening, info = reference.reset(seed=3, options={"persona": EN[0]})
    assert (task.data.prompt, task.data.system_prompt) == (opening, info["messages"][0]["content"])
    assert (task.data.persona_id, task.data.seed, task.key) == (EN[0], 3, f"{EN[0]}@3")

    (episode,) = play(env, stub, [task])
    assert episode.ok, episode.errors
    (trace,) = episode.traces
    assert seen == REPLIES  # the user read the agent's replies
    assert [(m.role, text(m.content)) for m in trace.messages] == [
        ("system", task.data.system_prompt),
        ("user", opening),
        ("assistant", REPLIES[0]),
        ("user", "reply 1 (emotion 40)"),
        ("assistant", REPLIES[1]),
        ("user", "reply 2 (emotion 35)"),
        ("assistant", REPLIES[2]),
    ]
    # the model was sent the whole conversation each turn, the user's replies included
    assert [text(m["content"]) for m in stub.requests[-1]["messages"] if m["role"] == "user"] == [
        opening,
        "reply 1 (emotion 40)",
        "reply 2 (emotion 35)",
    ]
    assert trace.reward == pytest.approx(0.25)
    assert list(trace.rewards) == ["emotion_change"]
    assert trace.metrics == pytest.approx({"emotion_change": 0.25, "final_emotion": 0.55, "turns": 3.0, "success": 0.0})
    assert trace.info["emotions"] == [30, 40, 35, 55]
    assert trace.info["termination_reason"] == "max_turns"


def test_concurrent_episodes_match_gym_make_with_the_final_emotion_reward(stub):
    """Two episodes at once with the rule user, scored by e_T / 100: each trace equals
    gym.make stepped with the same replies, so no dialogue got another's user turn."""
    env = evf.load_environment(
        "EmpathyDialogue-v0",
        persona_ids=[EN[1], EN[2]],
        seed=0,
        personas="en",
        protocol="rlver_training",
        max_turns=2,
        reward="final_emotion",
    )
    tasks = list(env.taskset)
    episodes = play(env, stub, tasks)
    for task, episode in zip(tasks, episodes):
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        reference = gym.make("EmpathyDialogue-v0", personas="en", protocol="rlver_training", max_turns=2)
        reference.reset(seed=task.data.seed, options={"persona": task.data.persona_id})
        steps = [reference.step(reply) for reply in REPLIES[:2]]
        users = [text(m.content) for m in trace.messages if m.role == "user"]
        assert users == [task.data.opening, steps[0][0]]
        final = steps[-1][4]["emotion"] / 100
        assert list(trace.rewards) == ["final_emotion"]
        assert trace.reward == pytest.approx(final)
        assert trace.metrics["emotion_change"] == pytest.approx(sum(s[1] for s in steps))
        assert trace.info["emotions"][-1] == steps[-1][4]["emotion"]


def test_vf_eval_runs_the_taskset_by_its_id(stub, tmp_path):
    """verifiers resolves the id ``empathy-dialogue`` to our classes, and its eval command
    line runs two tasks and writes their traces."""
    from verifiers.v1.cli.eval.main import main
    from verifiers.v1.utils.loaders import environment_class, resolve_env_config, taskset_class

    assert taskset_class(evf.TASKSET_ID) is evf.EmpathyTaskset
    assert environment_class(evf.TASKSET_ID) is evf.EmpathyEnv
    config = resolve_env_config({"taskset": {"id": evf.TASKSET_ID}})
    assert isinstance(config, evf.EmpathyEnvConfig)
    assert config.agent.harness.id == "null" and config.agent.runtime.type == "subprocess"

    main(
        [
            evf.TASKSET_ID,
            "-m",
            "stub",
            "--client.base-url",
            stub.url,
            "--client.api-key-var",
            "EMPATHY_GYM_STUB_KEY",
            "-n",
            "2",
            "-r",
            "1",
            "--no-rich",
            "--push",
            "false",
            "--output-dir",
            str(tmp_path),
            "--env.taskset.task.env",
            '{"protocol": "rlver_training", "max_turns": 2, "personas": "en"}',
        ]
    )
    (traces,) = tmp_path.glob("*/traces.jsonl")
    records = [json.loads(line) for line in traces.read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        (trace,) = record["traces"]
        assert set(trace["rewards"]) == {"emotion_change"}
        assert trace["metrics"]["turns"] == 2.0
