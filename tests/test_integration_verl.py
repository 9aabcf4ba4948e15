"""The verl <= 0.7.1 integration: EmpathyInteraction, the micro-batcher, compute_score and
the dataset builder (shared with the agent loop).

Everything here runs without verl. The tests marked "real verl" need verl 0.7.1 (the last
release with ``verl.interactions``) importable and skip otherwise; in the main run,
``test_interaction_against_verl_0_7_1`` runs them in a venv layered on this one that has
verl 0.7.1 (``tests/layered_venv.py``: stacked on the verl 0.9.1 layer for its dependencies).
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import gymnasium as gym
import pytest
from layered_venv import (
    VERL_0_7,
    VERL_0_9,
    LayerUnavailable,
    check_passed,
    layered_venv,
    run_pytest,
)

import empathy_gym  # noqa: F401
from empathy_gym.integrations import verl as ev
from empathy_gym.integrations.batching import MicroBatcher
from empathy_gym.personas import load_personas
from empathy_gym.user.scripted import ScriptedUser

REPO = Path(__file__).resolve().parent.parent
EN = [p.id for p in load_personas("en")]


def _verl_interactions_importable() -> bool:
    try:
        return importlib.util.find_spec("verl.interactions.base") is not None
    except ModuleNotFoundError:
        return False


needs_verl = pytest.mark.skipif(
    not _verl_interactions_importable(),
    reason="verl.interactions is not importable (verl not installed, or verl >= 0.8, "
           "which removed the interaction interface; 0.7.1 has it)")


@pytest.fixture(autouse=True)
def _fresh_sessions():
    yield
    ev.close_sessions()


def run(coro):
    return asyncio.run(coro)


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": text}]


def scripted_config(user, **extra):
    return {"name": "empathy", "env_id": "EmpathyDialogue-v0", "personas": "en",
            "protocol": "rlver_training", "user": user, **extra}


def test_interaction_against_verl_0_7_1(measured):
    """Runs this file's "real verl" tests with verl 0.7.1's own classes."""
    if _verl_interactions_importable():
        pytest.skip("verl 0.7.x is importable here: the real-verl tests run in this session")
    try:
        parent, parent_s = layered_venv("verl-0.9.1", VERL_0_9)
        python, build_s = layered_venv("verl-0.7.1", VERL_0_7, parent=parent)
    except LayerUnavailable as error:
        pytest.skip(f"verl 0.7.1 cannot be installed on this machine: {error}")
    expected = sum(1 for name in globals() if name.startswith("test_real_verl"))
    start = time.monotonic()
    check_passed(run_pytest(python, Path(__file__), "-k", "real_verl"), expected)
    measured(f"verl 0.7.1 layer (on the 0.9.1 layer): built in {parent_s + build_s:.0f} s "
             f"(0 = cached); {expected} real-verl tests ran in {time.monotonic() - start:.0f} s")


# -- the interface ---------------------------------------------------------------------
def test_module_works_without_verl_and_keeps_the_interface():
    assert issubclass(ev.EmpathyInteraction, ev.BaseInteraction)
    for method in ("start_interaction", "generate_response", "calculate_score",
                   "finalize_interaction"):
        assert asyncio.iscoroutinefunction(getattr(ev.EmpathyInteraction, method))
    interaction = ev.EmpathyInteraction({"name": "emp"})
    assert interaction.name == "emp" and interaction.config == {"name": "emp"}


@needs_verl
def test_real_verl_base_class_and_registry(tmp_path):
    """real verl: our class subclasses verl's BaseInteraction, and verl's own registry
    builds it from an interaction YAML."""
    from verl.interactions.base import BaseInteraction
    from verl.interactions.utils.interaction_registry import (
        initialize_interactions_from_config,
    )

    assert ev.VERL_AVAILABLE and issubclass(ev.EmpathyInteraction, BaseInteraction)
    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - name: empathy\n"
                    "    class_name: empathy_gym.integrations.verl.EmpathyInteraction\n"
                    "    config: {env_id: EmpathyDialogue-v0, backend: rule, "
                    "protocol: rlver_training}\n")
    interactions = initialize_interactions_from_config(str(path))
    interaction = interactions["empathy"]
    assert isinstance(interaction, ev.EmpathyInteraction)
    assert interaction.session.env_kwargs == {"backend": "rule", "protocol": "rlver_training"}
    run(interaction.start_interaction("r1", name="empathy", persona_id=EN[0], seed=0,
                                      opening="Hi."))
    done, reply, score, extra = run(interaction.generate_response(
        "r1", assistant("That sounds hard."), name="empathy", persona_id=EN[0], seed=0,
        opening="Hi."))
    assert isinstance(reply, str) and reply and extra["turn"] == 1 and done is False


@needs_verl
def test_real_verl_tool_agent_loop_runs_a_dataset_row(tmp_path, tiny_model_dir):
    """real verl: verl 0.7.1's own RLHFDataset reads our parquet, and its ToolAgentLoop
    (with a stub LLM server that always says the same thing) talks to our interaction
    until the env's 3-turn limit ends the dialogue."""
    tool_agent_loop = pytest.importorskip("verl.experimental.agent_loop.tool_agent_loop")
    import verl
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.replica import TokenOutput

    env_options = {"env_id": "EmpathyDialogue-v0", "protocol": "rlver_training", "max_turns": 3}
    (tmp_path / "interaction.yaml").write_text(
        "interaction:\n  - name: empathy\n"
        "    class_name: empathy_gym.integrations.verl.EmpathyInteraction\n"
        "    config: {env_id: EmpathyDialogue-v0, protocol: rlver_training, max_turns: 3}\n")
    ev.write_parquet(ev.build_rows(env_options, persona_ids=[EN[0]], seed=3),
                     tmp_path / "train.parquet")
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config"
                            / "_generated_ppo_trainer.yaml")
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    multi_turn.enable, multi_turn.max_assistant_turns = True, 4
    multi_turn.interaction_config_path = str(tmp_path / "interaction.yaml")
    config.data.update(max_prompt_length=1024, max_response_length=2048, return_raw_chat=True,
                       cache_dir=str(tmp_path / "cache"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    item = RLHFDataset(str(tmp_path / "train.parquet"), tokenizer, config.data)[0]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    class StubServer:
        calls = 0

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            StubServer.calls += 1
            ids = tokenizer.encode(f"That sounds hard ({StubServer.calls}).") + [end]
            return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids))

    async def rollout():
        loop = tool_agent_loop.ToolAgentLoop(
            trainer_config=DictConfigWrap(config), server_manager=StubServer(),
            tokenizer=tokenizer, processor=None, dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data))
        return await loop.run({"temperature": 1.0}, **item)

    output = asyncio.run(rollout())
    reference = gym.make("EmpathyDialogue-v0", protocol="rlver_training", max_turns=3)
    reference.reset(seed=3, options={"persona": EN[0]})
    steps = [reference.step(f"That sounds hard ({t}).") for t in (1, 2, 3)]
    assert output.extra_fields["turn_scores"] == pytest.approx([r for _, r, *_ in steps])
    assert output.num_turns == 7  # the prompt, 3 assistant turns, 3 user turns
    ended = steps[-1][2] or steps[-1][3]  # goodbye or the turn limit, whichever the user reaches
    assert ended and StubServer.calls == 3  # the env ended it, not verl
    response = tokenizer.decode(output.response_ids)
    assert all(obs in response for obs, *_ in steps)
    score = ev.compute_score("empathy_gym/EmpathyDialogue-v0", response, EN[0],
                             dict(output.extra_fields))
    assert score == pytest.approx(sum(r for _, r, *_ in steps))


# -- equivalence with gym.make ---------------------------------------------------------
ACTIONS = ["That sounds exhausting. What happened?",
           "It makes sense that you feel hurt; you did your part and still got blamed.",
           "You're not at fault here. What would help most right now?"]


def test_three_turns_match_gym_make_with_the_rule_user():
    seed, persona = 7, EN[5]
    reference = gym.make("EmpathyDialogue-v0", protocol="rlver_training")
    opening, info = reference.reset(seed=seed, options={"persona": persona})
    expected = [reference.step(action) for action in ACTIONS]

    interaction = ev.EmpathyInteraction({"name": "empathy", "env_id": "EmpathyDialogue-v0",
                                         "protocol": "rlver_training"})

    async def dialogue():
        await interaction.start_interaction("i-1", name="empathy", persona_id=persona,
                                            seed=seed, opening=opening)
        messages, results = list(info["messages"]), []
        for action in ACTIONS:
            messages.append({"role": "assistant", "content": action})
            result = await interaction.generate_response("i-1", messages)
            messages.append({"role": "user", "content": result[1]})
            results.append(result)
        return results, await interaction.calculate_score("i-1")

    results, score = run(dialogue())
    for (done, reply, reward, extra), (obs, r, term, trunc, step_info) in zip(results, expected):
        assert reply == obs
        assert reward == pytest.approx(r)
        assert done == (term or trunc)
        assert extra["emotion"] == step_info["emotion"]
        assert extra["privileged"]["appraisal"] == step_info["appraisal"]
    assert score == pytest.approx(sum(r for _, r, *_ in expected))


def test_scripted_dialogue_values_worked_out_by_hand():
    # RLVER training protocol: e_0 = 30, changes unclamped. Changes +10, -5, +20 give
    # emotions 40, 35, 55 and rewards 0.10, -0.05, 0.20; the return is 0.25.
    user = ScriptedUser([10, -5, 20])
    interaction = ev.EmpathyInteraction(scripted_config(user))

    async def dialogue():
        await interaction.start_interaction("d", persona_id=EN[0], seed=3, opening="Hello.")
        out = [await interaction.generate_response("d", assistant(f"reply {t}"))
               for t in range(3)]
        return out, await interaction.calculate_score("d")

    out, score = run(dialogue())
    assert [o[1] for o in out] == ["reply 1 (emotion 40)", "reply 2 (emotion 35)",
                                   "reply 3 (emotion 55)"]
    assert [o[2] for o in out] == pytest.approx([0.10, -0.05, 0.20])
    assert [o[0] for o in out] == [False, False, False]
    assert score == pytest.approx(0.25)
    extra = out[1][3]
    assert (extra["emotion"], extra["emotion_change"], extra["turn"]) == (35, -5, 2)
    assert extra["termination_reason"] is None and extra["persona_id"] == EN[0]
    assert extra["privileged"]["appraisal"]["change"] == -5
    assert extra["privileged"]["appraisal"]["thoughts"] == "turn 2"
    assert set(extra["privileged"]) == {"appraisal", "hidden_intention", "character_type"}
    assert "appraisal" not in extra and "hidden_intention" not in extra

    run(interaction.finalize_interaction("d"))
    run(interaction.finalize_interaction("d"))  # a second call is harmless
    with pytest.raises(KeyError, match="'d'"):
        run(interaction.calculate_score("d"))


def test_failure_terminates_and_a_later_turn_is_refused():
    # 30 - 20 = 10, then 10 - 15 -> clipped to 0 < 1: failure at turn 2.
    user = ScriptedUser([-20, -15])
    interaction = ev.EmpathyInteraction(scripted_config(user))

    async def dialogue():
        await interaction.start_interaction("f", persona_id=EN[1], seed=0, opening="Hi.")
        first = await interaction.generate_response("f", assistant("a"))
        second = await interaction.generate_response("f", assistant("b"))
        return first, second

    first, second = run(dialogue())
    assert first[0] is False and first[2] == pytest.approx(-0.20)
    assert second[0] is True and second[2] == pytest.approx(-0.10)
    assert second[3]["termination_reason"] == "failure" and second[3]["emotion"] == 0
    with pytest.raises(RuntimeError, match="has ended"):
        run(interaction.generate_response("f", assistant("c")))


def test_final_reward_mode_pays_e_T_over_100_on_the_last_turn():
    user = ScriptedUser([10, 10, 10])
    interaction = ev.EmpathyInteraction(scripted_config(user, reward_mode="final",
                                                        max_turns=2))

    async def dialogue():
        await interaction.start_interaction("m", persona_id=EN[2], seed=0, opening="Hi.")
        return [await interaction.generate_response("m", assistant("x")) for _ in range(2)]

    first, last = run(dialogue())
    assert (first[0], first[2]) == (False, 0.0)
    assert (last[0], last[2]) == (True, pytest.approx(0.50))  # 30 + 10 + 10 = 50
    assert last[3]["termination_reason"] == "max_turns"


def test_thinking_is_stripped_before_the_user_reads_it():
    user = ScriptedUser([5])
    interaction = ev.EmpathyInteraction(scripted_config(user, think=True))

    async def turn():
        await interaction.start_interaction("t", persona_id=EN[0], seed=0, opening="Hi.")
        return await interaction.generate_response(
            "t", assistant("<think>she wants praise</think>You handled that well."))

    done, reply, reward, extra = run(turn())
    dialogue = interaction.session.dialogues["t"].env.dialogue
    assert dialogue.history[-2] == ("agent", "You handled that well.")
    assert extra["format_error"] is None and reward == pytest.approx(0.05)


# -- concurrency and batching ----------------------------------------------------------
def test_concurrent_dialogues_never_mix():
    # Persona EN[0] rises by 10 a turn, EN[1] falls by 20: it fails at turn 2 while the
    # other goes on. Replies carry the emotion, so a mix-up would show.
    user = ScriptedUser(change_fn=lambda request: 10 if request.persona.id == EN[0] else -20)
    interaction = ev.EmpathyInteraction(scripted_config(user))

    async def dialogue(instance_id, persona, turns):
        await interaction.start_interaction(instance_id, persona_id=persona, seed=1,
                                            opening=f"opening of {instance_id}")
        out = []
        for turn in range(turns):
            out.append(await interaction.generate_response(
                instance_id, assistant(f"{instance_id} says {turn}")))
            if out[-1][0]:
                break
        return out

    async def both():
        return await asyncio.gather(dialogue("up", EN[0], 3), dialogue("down", EN[1], 3))

    up, down = run(both())
    assert [o[1] for o in up] == ["reply 1 (emotion 40)", "reply 2 (emotion 50)",
                                  "reply 3 (emotion 60)"]
    assert [o[1] for o in down] == ["reply 1 (emotion 10)", "reply 2 (emotion 0)"]
    assert down[-1][0] is True and up[-1][0] is False
    for instance_id, turns in (("up", 3), ("down", 2)):
        history = interaction.session.dialogues[instance_id].env.dialogue.history
        assert history[0] == ("user", f"opening of {instance_id}")
        assert [text for role, text in history if role == "agent"] == [
            f"{instance_id} says {t}" for t in range(turns)]


def _four_concurrent_turns(**options):
    user = ScriptedUser([5])
    interaction = ev.EmpathyInteraction(scripted_config(user, **options))

    async def main():
        for i in range(4):
            await interaction.start_interaction(f"b{i}", persona_id=EN[i], seed=i, opening="Hi.")
        return await asyncio.gather(*(interaction.generate_response(f"b{i}", assistant(f"a{i}"))
                                      for i in range(4)))

    results = run(main())
    assert [r[1] for r in results] == ["reply 1 (emotion 35)"] * 4
    return user.calls, interaction.session.batcher.batch_sizes


def test_micro_batcher_sends_concurrent_turns_as_one_user_call():
    assert _four_concurrent_turns() == (1, [4])


def test_micro_batcher_respects_max_batch_size():
    assert _four_concurrent_turns(max_batch_size=3) == (2, [3, 1])


def test_micro_batcher_off_gives_one_user_call_per_turn():
    assert _four_concurrent_turns(max_batch_size=1, batch_window_ms=0) == (4, [1, 1, 1, 1])


def test_batcher_hands_a_failure_to_every_caller_and_survives_a_new_loop():
    def fail_on_three(items):
        if 3 in items:
            raise ValueError("three")
        return [item * 10 for item in items]

    batcher = MicroBatcher(fail_on_three, window_s=0.002, max_batch=2)

    async def main():
        return await asyncio.gather(*(batcher.submit(i) for i in (1, 2, 3, 4)),
                                    return_exceptions=True)

    first, second, third, fourth = run(main())
    assert (first, second) == (10, 20)
    assert isinstance(third, ValueError) and isinstance(fourth, ValueError)
    assert run(main())[:2] == [10, 20]  # a second asyncio.run: a new event loop
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(fail_on_three, max_batch=0)


# -- sessions and errors ---------------------------------------------------------------
def test_equal_configs_share_one_session_and_user():
    # verl 0.7.1 builds one interaction object per sample: they must share the user.
    config = {"env_id": "EmpathyDialogue-v0", "protocol": "rlver_training"}
    a = ev.EmpathyInteraction({**config, "name": "empathy"})
    b = ev.EmpathyInteraction({**config, "name": "empathy"})
    c = ev.EmpathyInteraction({**config, "name": "empathy", "protocol": "sage"})
    assert a.session is b.session and a.session.user is b.session.user
    assert c.session is not a.session
    run(a.start_interaction("shared", persona_id=EN[0], seed=0, opening="Hi."))
    assert run(b.calculate_score("shared")) == 0.0


def test_oldest_dialogue_is_dropped_beyond_max_instances():
    interaction = ev.EmpathyInteraction(scripted_config(ScriptedUser([0]), max_instances=2))
    for name in ("x", "y", "z"):
        run(interaction.start_interaction(name, persona_id=EN[0], seed=0, opening="Hi."))
    assert list(interaction.session.dialogues) == ["y", "z"]


def test_bad_requests_raise_errors_that_name_the_field():
    interaction = ev.EmpathyInteraction(scripted_config(ScriptedUser([0])))
    with pytest.raises(KeyError, match="'seed'"):
        run(interaction.start_interaction("e", persona_id=EN[0], opening="Hi."))
    with pytest.raises(TypeError, match="'opening'"):
        run(interaction.start_interaction("e", persona_id=EN[0], seed=0, opening=3))
    with pytest.raises(KeyError, match="unknown persona id"):
        run(interaction.start_interaction("e", persona_id="nobody", seed=0, opening="Hi."))
    run(interaction.start_interaction("e", persona_id=EN[0], seed=0, opening="Hi."))
    with pytest.raises(ValueError, match="already running"):
        run(interaction.start_interaction("e", persona_id=EN[0], seed=0, opening="Hi."))
    with pytest.raises(ValueError, match="no assistant message"):
        run(interaction.generate_response("e", [{"role": "user", "content": "Hi."}]))
    with pytest.raises(KeyError, match="'ghost'"):
        run(interaction.generate_response("ghost", assistant("x")))
    assert run(interaction.start_interaction(persona_id=EN[0], seed=0, opening="Hi.")) != "e"


def test_compute_score_sums_the_turn_scores():
    assert ev.compute_score("empathy_gym/x", "...", EN[0],
                            {"turn_scores": [0.1, -0.05, 0.2]}) == pytest.approx(0.25)
    assert ev.compute_score("s", "", "", {"turn_scores": []}) == 0.0
    with pytest.raises(KeyError, match="turn_scores"):
        ev.compute_score("s", "", "", {"index": 0})


# -- the dataset -----------------------------------------------------------------------
def test_rows_reproduce_the_env_reset_and_the_interaction_recreates_them():
    config = {"name": "empathy", "env_id": "EmpathyDialogue-v0", "protocol": "rlver_training",
              "think": True}
    rows = ev.build_rows(config, persona_ids=[EN[3], EN[4]], seed=10)
    assert len(rows) == 2
    for index, row in enumerate(rows):
        reference = gym.make("EmpathyDialogue-v0", protocol="rlver_training", think=True)
        opening, info = reference.reset(seed=10 + index, options={"persona": row["extra_info"]
                                                                  ["persona_id"]})
        assert row["prompt"] == info["messages"]
        assert row["prompt"][0]["role"] == "system" and "<think>" in row["prompt"][0]["content"]
        assert row["extra_info"]["interaction_kwargs"] == {
            "name": "empathy", "persona_id": [EN[3], EN[4]][index], "seed": 10 + index,
            "opening": opening}
        assert row["extra_info"]["index"] == index and row["extra_info"]["split"] == "train"
        assert row["reward_model"] == {"style": "rule", "ground_truth": [EN[3], EN[4]][index]}
        assert row["data_source"] == "empathy_gym/EmpathyDialogue-v0"

    interaction = ev.EmpathyInteraction(config)
    run(interaction.start_interaction("row0", **rows[0]["extra_info"]["interaction_kwargs"]))
    assert interaction.session.dialogues["row0"].env.dialogue.messages == rows[0]["prompt"]


def test_parquet_files_round_trip_and_the_cli_writes_them(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    config = {"env_id": "EmpathyDialogue-v0", "personas": "en"}
    paths = ev.prepare_dataset(tmp_path / "a", config, seed=1, val_size=4)
    train = pq.read_table(paths["train"]).to_pylist()
    val = pq.read_table(paths["val"]).to_pylist()
    assert (len(train), len(val)) == (44, 4)
    assert {r["extra_info"]["persona_id"] for r in train + val} == set(EN)
    train_ids = [r["extra_info"]["persona_id"] for r in train]
    assert train == ev.build_rows(config, persona_ids=train_ids, seed=1)
    assert {r["extra_info"]["split"] for r in val} == {"val"}

    ev.main(["prepare", "--personas", "en", "--env-id", "EmpathyDialogue-v0",
             "--out", str(tmp_path / "b"), "--seed", "1", "--val-size", "0"])
    assert not (tmp_path / "b" / "val.parquet").exists()
    assert len(pq.read_table(tmp_path / "b" / "train.parquet").to_pylist()) == 48
    with pytest.raises(ValueError, match="val_size"):
        ev.prepare_dataset(tmp_path / "c", config, val_size=48)


def test_shipped_interaction_config_parses():
    config = ev.load_interaction_config(REPO / "agents" / "verl" / "v0.7" / "interaction.yaml")
    assert config["name"] == "empathy"
    assert config["env_id"] == "EmpathyDialogue-RLVER-v0"
    assert config["protocol"] == "rlver_training" and config["max_turns"] == 9


# -- the training configs --------------------------------------------------------------
RLVER_SETTINGS = {  # DESIGN.md section 1 (RLVER's training facts)
    "data.train_batch_size": 32, "actor_rollout_ref.actor.optim.lr": 1e-6,
    "critic.optim.lr": 5e-6, "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False, "actor_rollout_ref.actor.entropy_coeff": 0.001,
    "actor_rollout_ref.actor.clip_ratio": 0.2, "algorithm.gamma": 1.0, "algorithm.lam": 1.0,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.multi_turn.enable": True,
    "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
    "reward.custom_reward_function.path": "pkg://empathy_gym.integrations.verl",
    "reward.custom_reward_function.name": "compute_score",
}


def test_training_configs_carry_rlver_settings():
    from omegaconf import OmegaConf

    folder = REPO / "agents" / "verl" / "v0.7"
    common = OmegaConf.load(folder / "rlver_common.yaml")
    for key, value in RLVER_SETTINGS.items():
        assert OmegaConf.select(common, key) == value, key
    assert OmegaConf.select(common, "algorithm.adv_estimator") == "gae"
    assert OmegaConf.select(common, "actor_rollout_ref.rollout.n") == 1
    grpo = OmegaConf.load(folder / "rlver_grpo.yaml")
    assert OmegaConf.select(grpo, "algorithm.adv_estimator") == "grpo"
    assert OmegaConf.select(grpo, "actor_rollout_ref.rollout.n") == 4
    # verl stops after max_assistant_turns before the user answers: it must exceed the
    # env's 9-turn limit, or the 9th reply would never be appraised.
    interaction = ev.load_interaction_config(folder / "interaction.yaml")
    turns = OmegaConf.select(common, "actor_rollout_ref.rollout.multi_turn.max_assistant_turns")
    assert turns == interaction["max_turns"] + 1


@needs_verl
def test_real_verl_composes_and_validates_the_training_configs(monkeypatch, tiny_model_dir):
    """real verl: hydra composes our configs over verl 0.7.1's ppo_trainer, and verl's
    own validate_config and config dataclasses accept them."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.import_utils import load_extern_object

    # The critic's config reads the model's Hugging Face config: use a local one.
    monkeypatch.setenv("EMPATHY_POLICY_MODEL", str(tiny_model_dir))
    for name, estimator, n, critic in (("rlver_ppo", "gae", 1, True),
                                       ("rlver_grpo", "grpo", 4, False)):
        with initialize_config_dir(config_dir=str(REPO / "agents" / "verl" / "v0.7"),
                                   version_base=None):
            config = compose(config_name=name)
        OmegaConf.resolve(config)
        for key, value in RLVER_SETTINGS.items():
            assert OmegaConf.select(config, key) == value, (name, key)
        assert config.algorithm.adv_estimator == estimator
        assert config.actor_rollout_ref.rollout.n == n
        assert need_critic(config) is critic and need_reference_policy(config) is False
        validate_config(config, need_reference_policy(config), need_critic(config))
        rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
        assert rollout.multi_turn.max_assistant_turns == 10
    reward = config.reward.custom_reward_function
    assert load_extern_object(reward.path, reward.name)(
        "s", "", "", {"turn_scores": [0.25, 0.5]}) == pytest.approx(0.75)
