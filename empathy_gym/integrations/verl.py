"""verl plumbing shared by both verl adapters, and the simulated user as a verl <= 0.7.1
*interaction*.

Two adapters connect our simulated user to verl (volcengine/verl, the trainer RLVER used):

* verl >= 0.8 (0.9.x on PyPI now): the agent loop
  :class:`empathy_gym.integrations.verl_agent_loop.EmpathyAgentLoop` (needs verl to import);
* verl <= 0.7.1: :class:`EmpathyInteraction` here, verl's multi-turn *interaction*
  (``verl.interactions.base.BaseInteraction``), kept for clusters pinned to 0.7.x. verl 0.8.0
  removed ``verl.interactions`` and the interaction path of ``ToolAgentLoop``.

What both share lives here and imports without verl: the per-process :class:`Session`
(one simulated user, a :class:`~empathy_gym.integrations.batching.MicroBatcher` that sends
concurrent user turns as one :func:`~empathy_gym.env.step_many` call), the dataset rows
(:func:`build_rows`, :func:`prepare_dataset`, ``python -m empathy_gym.integrations.verl
prepare``), :func:`dialogue_fields` and the reward function :func:`compute_score`.

The interaction (verl <= 0.7.1):

* ``start_interaction(instance_id, persona_id=, seed=, opening=)`` recreates the dataset
  row's dialogue: ``env.prepare_reset(seed, persona)`` then ``env.finish_reset(persona,
  opening)``, with the opening stored in the row (an LLM user's opening is never
  regenerated differently);
* ``generate_response(instance_id, messages)`` sends the last assistant message to the
  user (thinking is stripped by the env) and returns ``(terminated or truncated, the
  user's reply, the env's reward, additional_data)``;
* ``calculate_score(instance_id)`` is the running return; ``finalize_interaction``
  drops the dialogue.

With verl 0.7.x importable we subclass its ``BaseInteraction``; otherwise a local class
with the same interface stands in, so this module imports and works without verl.

verl 0.7.1 facts that shape the interaction (read in its source):

* ``ToolAgentLoop`` is instantiated **per sample** and builds its interactions in its
  constructor, so one interaction object exists per dialogue. The simulated user, the
  dialogue table and the batcher therefore live in a per-process :class:`Session`
  shared by every interaction object built from an equal config.
* It never calls ``finalize_interaction`` and stops after ``max_assistant_turns``
  without telling the interaction, so the table holds at most ``max_instances``
  dialogues and drops the oldest beyond that (with a warning).
* Turn scores reach the reward function as ``extra_info["turn_scores"]``;
  :func:`compute_score` sums them (``reward.custom_reward_function``).
* It calls ``generate_response(request_id, messages, **interaction_kwargs)``.

The dataset builder writes verl's RL parquet format (as in verl's
``examples/data_preprocess/gsm8k_multiturn_w_interaction.py``): ``data_source``,
``prompt`` (the agent-side chat), ``ability``, ``reward_model`` (``style``,
``ground_truth``) and ``extra_info`` with ``interaction_kwargs`` (``persona_id``,
``seed``, ``opening``), which verl's ``RLHFDataset`` also hands to agent loops as a
top-level ``interaction_kwargs`` field. The same rows serve both adapters.
"""

from __future__ import annotations

import argparse
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import empathy_gym  # noqa: F401  (registers the env ids)
from empathy_gym.boundary import neutralise
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.integrations.dialogues import (
    SHARED_USER_KEYS,
    SharedUser,
    close_shared,
    dialogue_fields,
    dialogue_starts,
    persona_bank,
    shared,
    start_env,
)

logger = logging.getLogger(__name__)

try:  # verl <= 0.7.1 has the interaction interface; 0.8+ removed it
    from verl.interactions.base import BaseInteraction
    VERL_AVAILABLE = True
except ImportError:
    VERL_AVAILABLE = False

    class BaseInteraction:  # type: ignore[no-redef]
        """Stand-in for ``verl.interactions.base.BaseInteraction`` (verl 0.7.1), used
        when verl is not importable: the same constructor and coroutine methods."""

        def __init__(self, config: dict[str, Any]):
            self.config = config
            self.name: str = config.get("name", "interaction_agent")

        async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
            return instance_id if instance_id is not None else str(uuid4())

        async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                    **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
            raise NotImplementedError

        async def calculate_score(self) -> float:
            return 0.0

        async def finalize_interaction(self) -> None:
            return None


#: Interaction-config keys read by :class:`Session`; every other key (except ``name``)
#: goes to ``gym.make`` (``backend``, ``model``, ``base_url``, ``appraisal_mode``,
#: ``protocol``, ``difficulty``, ``personas``, ``reward_mode``, ``think``, ...).
SESSION_KEYS = {**SHARED_USER_KEYS, "max_instances": 4096}
DEFAULT_NAME = "empathy"


@dataclass
class Dialogue:
    """One running dialogue of a :class:`Session`.

    Attributes:
        env: its own env (sharing the session's simulated user).
        score: the running return, the sum of the rewards so far (float).
        done: the env reported terminated or truncated.
        busy: a ``generate_response`` for it is in flight.
    """

    env: EmpathyDialogueEnv
    score: float = 0.0
    done: bool = False
    busy: bool = False


class Session(SharedUser):
    """What all verl adapter objects of one process and one config share: the simulated
    user (built once) and the micro-batcher (:class:`SharedUser`), plus the interaction's
    dialogues by instance id.

    Args:
        config: the adapter config (see :data:`SESSION_KEYS`; other keys except
            ``name`` are ``gym.make`` keywords, e.g. ``{"backend": "openai", "model":
            "...", "base_url": "...", "protocol": "rlver_training"}``; a ``user`` key may
            hold a ready :class:`~empathy_gym.user.SimulatedUser`, from Python only).

    Raises:
        gymnasium.error.Error: an unknown ``env_id``. ValueError/KeyError: bad env options.
    """

    option_defaults = SESSION_KEYS

    def __init__(self, config: Mapping[str, Any]):
        super().__init__(config)
        self.max_instances = int(self.options["max_instances"])
        self.dialogues: OrderedDict[str, Dialogue] = OrderedDict()

    def add(self, instance_id: str, dialogue: Dialogue) -> None:
        """Register a dialogue; beyond ``max_instances`` drop the oldest (verl 0.7.1
        never calls ``finalize_interaction``).

        Raises:
            ValueError: ``instance_id`` is already running.
        """
        if instance_id in self.dialogues:
            raise ValueError(f"instance_id {instance_id!r} is already running; "
                             f"finalize it before starting it again")
        while len(self.dialogues) >= self.max_instances:
            old_id, _ = self.dialogues.popitem(last=False)
            logger.warning("empathy interaction: more than %d dialogues open; dropped the "
                           "oldest, %r (raise max_instances if it was still running)",
                           self.max_instances, old_id)
        self.dialogues[instance_id] = dialogue

    def get(self, instance_id: str) -> Dialogue:
        """The running dialogue ``instance_id``.

        Raises:
            KeyError: no such dialogue (never started, finalized, or dropped).
        """
        try:
            return self.dialogues[instance_id]
        except KeyError:
            raise KeyError(f"no running dialogue with instance_id {instance_id!r}; call "
                           f"start_interaction first ({len(self.dialogues)} running)") from None


def shared_session(config: Mapping[str, Any]) -> Session:
    """The process-wide :class:`Session` for ``config`` (created on first use); configs
    equal up to ``name`` share one."""
    return shared(Session, config)


def close_sessions() -> None:
    """Close every shared session's (and shared user's) simulated user and forget them."""
    close_shared()


def _last_assistant_content(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # OpenAI content parts: keep the text parts
                return "".join(part.get("text", "") for part in content
                               if isinstance(part, Mapping) and part.get("type") == "text")
            raise TypeError(f"messages: the last assistant message's 'content' must be a "
                            f"str, got {type(content).__name__}")
    raise ValueError("messages holds no assistant message: generate_response needs the "
                     "agent's reply as the last 'assistant' message")


class EmpathyInteraction(BaseInteraction):
    """The simulated user behind verl's multi-turn interaction interface.

    Args:
        config: the interaction config from verl's interaction YAML (the ``config:``
            mapping; verl adds ``name``). Keys: ``env_id`` (default
            ``"EmpathyDialogue-RLVER-v0"``), ``batch_window_ms`` (5.0),
            ``max_batch_size`` (64), ``max_instances`` (4096), and any ``gym.make``
            keyword (``backend``, ``model``, ``base_url``, ``appraisal_mode``,
            ``protocol``, ``difficulty``, ``personas``, ``reward_mode``, ``think``, ...).

    Every object built from an equal config shares one :class:`Session` (one simulated
    user, one dialogue table keyed by instance id, one micro-batcher) in its process.

    Example:
        >>> import asyncio
        >>> row = build_rows({"env_id": "EmpathyDialogue-v0"},
        ...                  persona_ids=["en-001-warehouse-warning"])[0]
        >>> interaction = EmpathyInteraction({"name": "empathy", "env_id": "EmpathyDialogue-v0"})
        >>> async def one_turn():
        ...     await interaction.start_interaction("a", **row["extra_info"]["interaction_kwargs"])
        ...     messages = row["prompt"] + [{"role": "assistant", "content": "That sounds hard."}]
        ...     return await interaction.generate_response("a", messages)
        >>> done, reply, reward, extra = asyncio.run(one_turn())   # reward: emotion change / 100
    """

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.name = config.get("name", DEFAULT_NAME)
        self.session = shared_session(config)

    async def start_interaction(self, instance_id: str | None = None, *,
                                persona_id: str | None = None, seed: int | None = None,
                                opening: str | None = None, **kwargs: Any) -> str:
        """Start the dialogue of a dataset row (its ``extra_info.interaction_kwargs``).

        Args:
            instance_id: verl's request id; a new uuid when ``None``.
            persona_id: the persona's id in the env's bank.
            seed: the env seed (int >= 0) the row was built with.
            opening: the user's opening line as stored in the row (the last message of
                the row's ``prompt``).
            **kwargs: ignored (verl passes ``name`` and the other row kwargs).

        Returns:
            The instance id.

        Raises:
            KeyError: a missing field, or an unknown persona id.
            TypeError: a field of the wrong type. ValueError: ``instance_id`` is running.
        """
        start = {"persona_id": persona_id, "seed": seed, "opening": opening}
        dialogue_fields(start)  # validate before anything changes
        instance_id = instance_id if instance_id is not None else str(uuid4())
        env = self.session.new_env()
        start_env(env, start)
        self.session.add(instance_id, Dialogue(env))
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        """The user's answer to the last assistant message of ``messages``.

        Returns:
            ``(should_terminate_sequence, response_content, current_turn_score,
            additional_data)``: the env's ``terminated or truncated``; the user's reply
            (:func:`~empathy_gym.boundary.neutralise`-d: verl tokenizes it with special
            tokens parsed);
            the env's reward (``reward_mode="delta"``: emotion change / 100, in
            [-1, 1]; ``"final"``: e_T / 100 on the last turn, else 0; minus the think
            format penalty); and ``{"emotion": int 0-100, "emotion_change": int,
            "turn": int, "termination_reason": str | None, "format_error": str | None,
            "persona_id": str, "privileged": {"appraisal", "hidden_intention",
            "character_type"}}``; ``privileged`` is for logging, never for the policy.

        Raises:
            KeyError: unknown ``instance_id``. ValueError/TypeError: no usable assistant
            message. RuntimeError: the dialogue has ended, or a turn for it is in flight.
            SimulatorError: the LLM user failed (raised for every dialogue of its batch).
        """
        dialogue = self.session.get(instance_id)
        if dialogue.done:
            raise RuntimeError(f"dialogue {instance_id!r} has ended "
                               f"({dialogue.env.dialogue.done_reason}); finalize it")
        if dialogue.busy:
            raise RuntimeError(f"dialogue {instance_id!r} already has a turn in flight")
        action = _last_assistant_content(messages)
        dialogue.busy = True
        try:
            reply, reward, terminated, truncated, info = await self.session.step(
                dialogue.env, action)
        finally:
            dialogue.busy = False
        dialogue.score += float(reward)
        dialogue.done = bool(terminated or truncated)
        additional = {
            "emotion": info["emotion"], "emotion_change": info["emotion_change"],
            "turn": info["turn"], "termination_reason": info["termination_reason"],
            "format_error": info["format_error"], "persona_id": info["persona_id"],
            "privileged": {"appraisal": info["appraisal"],
                           "hidden_intention": info["hidden_intention"],
                           "character_type": info["character_type"]},
        }
        return dialogue.done, neutralise(reply), float(reward), additional

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """The running return of the dialogue: the sum of its turn scores (delta mode:
        (e_t - e_0) / 100 so far).

        Raises:
            KeyError: unknown ``instance_id``.
        """
        return self.session.get(instance_id).score

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the dialogue. Safe to call twice or for a dropped id."""
        dialogue = self.session.dialogues.pop(instance_id, None)
        if dialogue is not None:
            dialogue.env.close()  # does not close the shared user


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> float:
    """verl reward function (``reward.custom_reward_function``): the dialogue's return,
    the sum of the interaction's turn scores, placed by verl on the last token.

    With ``reward_mode="delta"`` this is (e_T - e_0) / 100 in [-1, 1] (RLVER's e_T / 100
    less a per-persona constant; it stays right when verl cuts a dialogue short), with
    ``"final"`` it is e_T / 100 for a dialogue that the user ended.

    Raises:
        KeyError: ``extra_info`` has no ``turn_scores`` (verl puts them there when the
            rollout uses ``ToolAgentLoop`` with ``interaction_config_path`` and the
            streaming reward loop, the default without a reward model).
    """
    if not extra_info or "turn_scores" not in extra_info:
        raise KeyError("extra_info has no 'turn_scores': run verl's tool_agent loop with "
                       "actor_rollout_ref.rollout.multi_turn.interaction_config_path set")
    return float(sum(float(score) for score in extra_info["turn_scores"]))


# -- the dataset -------------------------------------------------------------------------
def build_rows(config: Mapping[str, Any] | None = None, *, persona_ids: Sequence[str] | None = None,
               seed: int = 0, split: str = "train", data_source: str | None = None
               ) -> list[dict[str, Any]]:
    """verl dataset rows, one per persona: the dialogue as ``EmpathyDialogueEnv.reset``
    starts it.

    Args:
        config: the adapter config: the agent loop's (:func:`load_agent_loop_config`) or
            the interaction's (:class:`EmpathyInteraction`), so that the rows match the
            dialogue the adapter recreates (system prompt, think mode).
        persona_ids: which personas, in order; ``None`` for the whole bank.
        seed: row i gets env seed ``seed + i``.
        split: written to ``extra_info.split``.
        data_source: ``None`` gives ``"empathy_gym/<env_id>"``.

    Returns:
        Dicts with ``data_source``, ``prompt`` (``info["messages"]`` after reset: the
        agent's system prompt and the user's opening line), ``ability`` ("empathy"),
        ``reward_model`` (``{"style": "rule", "ground_truth": persona_id}``; verl needs
        the field, our reward ignores it) and ``extra_info`` (``split``, ``index``,
        ``persona_id``, ``interaction_kwargs``: ``name``, ``persona_id``, ``seed``,
        ``opening``).

    Raises:
        KeyError: an unknown persona id. As :class:`Session` for a bad config.
    """
    config = dict(config or {})
    name = config.get("name", DEFAULT_NAME)
    env_id = config.get("env_id", SESSION_KEYS["env_id"])
    return [{
        "data_source": data_source or f"empathy_gym/{env_id}",
        "prompt": start.messages,
        "ability": "empathy",
        "reward_model": {"style": "rule", "ground_truth": start.persona_id},
        "extra_info": {"split": split, "index": index, "persona_id": start.persona_id,
                       "interaction_kwargs": {"name": name, "persona_id": start.persona_id,
                                              "seed": start.seed, "opening": start.opening}},
    } for index, start in enumerate(dialogue_starts(config, persona_ids=persona_ids, seed=seed))]


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows as a parquet file (pyarrow; ``pip install empathy-gym[verl]``).

    Raises:
        ImportError: pyarrow is missing, saying how to install it.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError("writing verl parquet files needs pyarrow: "
                          "pip install 'empathy-gym[verl]'") from error
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(row) for row in rows]), path)
    return path


def prepare_dataset(out_dir: str | Path, config: Mapping[str, Any] | None = None, *,
                    seed: int = 0, val_size: int = 32) -> dict[str, Path]:
    """Write ``train.parquet`` (and ``val.parquet``) for verl under ``out_dir``.

    ``val_size`` personas, drawn with ``numpy.random.default_rng(seed)``, go to
    ``val.parquet`` and the rest to ``train.parquet``; ``val_size=0`` writes only
    ``train.parquet``, with every persona.

    Returns:
        ``{"train": path, "val": path}`` (``"val"`` only when written).

    Raises:
        ValueError: ``val_size`` negative or not smaller than the bank.
    """
    import numpy as np

    bank = [p.id for p in persona_bank(config)]
    if not 0 <= val_size < len(bank):
        raise ValueError(f"val_size must be in [0, {len(bank) - 1}] for a bank of "
                         f"{len(bank)} personas, got {val_size}")
    order = np.random.default_rng(seed).permutation(len(bank))
    val_ids = {bank[i] for i in order[:val_size]}
    out = Path(out_dir)
    paths = {"train": write_parquet(
        build_rows(config, persona_ids=[p for p in bank if p not in val_ids], seed=seed),
        out / "train.parquet")}
    if val_size:
        paths["val"] = write_parquet(
            build_rows(config, persona_ids=[p for p in bank if p in val_ids],
                       seed=seed + len(bank), split="val"), out / "val.parquet")
    return paths


def load_interaction_config(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The ``config`` mapping of our entry in a verl interaction YAML (``interaction:``
    list of ``{name, class_name, config}``, verl <= 0.7.1), with ``name`` added as verl does.

    Raises:
        KeyError: no entry with ``class_name`` ending in ``EmpathyInteraction`` (or with
            that ``name``).
    """
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True).get("interaction", [])
    for entry in entries:
        if (name is None and str(entry.get("class_name", "")).endswith("EmpathyInteraction")) \
                or (name is not None and entry.get("name") == name):
            return {**(entry.get("config") or {}), "name": entry.get("name", DEFAULT_NAME)}
    raise KeyError(f"{path}: field 'interaction': no EmpathyInteraction entry"
                   + (f" named {name!r}" if name else ""))


def load_agent_loop_config(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The session config of our entry in a verl agent-loop YAML (verl >= 0.8,
    ``rollout.agent.agent_loop_config_path``: a list of ``{name, _target_, ...}``): the
    entry without ``name`` and ``_target_``, i.e. the keyword arguments that
    :class:`~empathy_gym.integrations.verl_agent_loop.EmpathyAgentLoop` receives.

    Args:
        path: the YAML file (``${oc.env:...}`` interpolations are resolved).
        name: the entry's ``name``; ``None`` takes the first entry whose ``_target_`` ends
            in ``EmpathyAgentLoop``.

    Raises:
        KeyError: no such entry. TypeError: the file is not a list of entries.
    """
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(entries, list):
        raise TypeError(f"{path}: an agent-loop config is a list of {{name, _target_, ...}} "
                        f"entries, got a {type(entries).__name__}")
    for entry in entries:
        if (name is None and str(entry.get("_target_", "")).endswith("EmpathyAgentLoop")) \
                or (name is not None and entry.get("name") == name):
            return {key: value for key, value in entry.items() if key not in ("name", "_target_")}
    raise KeyError(f"{path}: no EmpathyAgentLoop entry" + (f" named {name!r}" if name else "")
                   + f" (entries: {[entry.get('name') for entry in entries]})")


def load_config(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The env options of our entry in either kind of verl YAML: an agent-loop config
    (a list, :func:`load_agent_loop_config`) or an interaction config (``interaction:``,
    :func:`load_interaction_config`)."""
    from omegaconf import ListConfig, OmegaConf

    if isinstance(OmegaConf.load(path), ListConfig):
        return load_agent_loop_config(path, name)
    return load_interaction_config(path, name)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m empathy_gym.integrations.verl prepare --config agents/verl/agent_loop.yaml
    --out DIR`` (or ``--personas rlver`` without a config)."""
    parser = argparse.ArgumentParser(prog="python -m empathy_gym.integrations.verl")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="write verl parquet files of dialogue starts")
    prepare.add_argument("--out", required=True, help="output folder")
    prepare.add_argument("--config", help="verl agent-loop YAML (e.g. agents/verl/agent_loop.yaml) "
                                          "or interaction YAML (agents/verl/v0.7/interaction.yaml) "
                                          "to read the env options from")
    prepare.add_argument("--name", help="which entry of --config (default: the first of ours)")
    prepare.add_argument("--personas", help="persona bank: 'rlver', 'en', 'zh' or a JSONL path")
    prepare.add_argument("--env-id", help="registered env id (default from --config, "
                                          f"else {SESSION_KEYS['env_id']})")
    prepare.add_argument("--seed", type=int, default=0, help="row i gets env seed SEED + i")
    prepare.add_argument("--val-size", type=int, default=32,
                         help="personas held out for val.parquet (0: none)")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.name) if args.config else {}
    if args.personas:
        config["personas"] = args.personas
    if args.env_id:
        config["env_id"] = args.env_id
    paths = prepare_dataset(args.out, config, seed=args.seed, val_size=args.val_size)
    for split, path in paths.items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
