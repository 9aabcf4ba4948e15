"""verl plumbing that imports without verl, for the agent loop
:class:`empathy_gym.integrations.verl_agent_loop.EmpathyAgentLoop`: the dataset
(:func:`build_rows`, ``python -m empathy_gym.integrations.verl prepare``), the reward
function :func:`compute_score` and :func:`load_agent_loop_config`.

The rows follow verl's RL parquet format (as verl's
``examples/data_preprocess/gsm8k_multiturn_w_interaction.py``); verl's ``RLHFDataset`` hands
their ``extra_info.interaction_kwargs`` to agent loops as a top-level field. See
agents/verl/README.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import empathy_gym  # noqa: F401  (registers the env ids)
from empathy_gym.engine import ENGINE_KEYS
from empathy_gym.integrations.dialogues import dialogue_starts, persona_bank

#: The ``name`` written into each row's ``interaction_kwargs`` when the config has none
#: (verl's row format has it; the agent loop does not read it).
DEFAULT_NAME = "empathy"


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None, **kwargs: Any
) -> float:
    """verl reward function (``reward.custom_reward_function``): the dialogue's return, the
    sum of the turn scores that the agent loop records (``extra_fields["turn_scores"]``,
    which verl's reward managers pass on in ``extra_info``).

    The agent loop sets each trajectory's reward itself, so verl calls no reward function
    for its rows; this one gives the same sum for any path that would: with
    ``reward_mode="delta"`` (e_T - e_0) / 100 in [-1, 1], with ``"final"`` e_T / 100 for a
    dialogue that the user ended.

    Raises:
        KeyError: ``extra_info`` has no ``turn_scores``.
    """
    if not extra_info or "turn_scores" not in extra_info:
        raise KeyError(
            "extra_info has no 'turn_scores': score rollouts of the empathy_dialogue agent loop, which records them"
        )
    return float(sum(float(score) for score in extra_info["turn_scores"]))


# -- the dataset -------------------------------------------------------------------------
def build_rows(
    config: Mapping[str, Any] | None = None,
    *,
    persona_ids: Sequence[str] | None = None,
    seed: int = 0,
    split: str = "train",
    data_source: str | None = None,
) -> list[dict[str, Any]]:
    """verl dataset rows, one per persona: the dialogue as ``EmpathyDialogueEnv.reset``
    starts it.

    Args:
        config: the agent loop's config (:func:`load_agent_loop_config`), so that the rows
            match the dialogue the loop recreates (system prompt, think mode).
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
        KeyError: an unknown persona id. As
            :class:`~empathy_gym.engine.DialogueEngine` for a bad config.
    """
    config = dict(config or {})
    name = config.get("name", DEFAULT_NAME)
    env_id = config.get("env_id", ENGINE_KEYS["env_id"])
    return [
        {
            "data_source": data_source or f"empathy_gym/{env_id}",
            "prompt": start.messages,
            "ability": "empathy",
            "reward_model": {"style": "rule", "ground_truth": start.persona_id},
            "extra_info": {
                "split": split,
                "index": index,
                "persona_id": start.persona_id,
                "interaction_kwargs": {
                    "name": name,
                    "persona_id": start.persona_id,
                    "seed": start.seed,
                    "opening": start.opening,
                },
            },
        }
        for index, start in enumerate(dialogue_starts(config, persona_ids=persona_ids, seed=seed))
    ]


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows as a parquet file (pyarrow; ``pip install empathy-gym[verl]``).

    Raises:
        ImportError: pyarrow is missing, saying how to install it.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError("writing verl parquet files needs pyarrow: pip install 'empathy-gym[verl]'") from error
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(row) for row in rows]), path)
    return path


def prepare_dataset(
    out_dir: str | Path, config: Mapping[str, Any] | None = None, *, seed: int = 0, val_size: int = 32
) -> dict[str, Path]:
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
        raise ValueError(f"val_size must be in [0, {len(bank) - 1}] for a bank of {len(bank)} personas, got {val_size}")
    order = np.random.default_rng(seed).permutation(len(bank))
    val_ids = {bank[i] for i in order[:val_size]}
    out = Path(out_dir)
    paths = {
        "train": write_parquet(
            build_rows(config, persona_ids=[p for p in bank if p not in val_ids], seed=seed), out / "train.parquet"
        )
    }
    if val_size:
        paths["val"] = write_parquet(
            build_rows(config, persona_ids=[p for p in bank if p in val_ids], seed=seed + len(bank), split="val"),
            out / "val.parquet",
        )
    return paths


def load_agent_loop_config(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The env config of our entry in a verl agent-loop YAML (verl >= 0.8,
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
        raise TypeError(
            f"{path}: an agent-loop config is a list of {{name, _target_, ...}} entries, got a {type(entries).__name__}"
        )
    for entry in entries:
        if (name is None and str(entry.get("_target_", "")).endswith("EmpathyAgentLoop")) or (
            name is not None and entry.get("name") == name
        ):
            return {key: value for key, value in entry.items() if key not in ("name", "_target_")}
    raise KeyError(
        f"{path}: no EmpathyAgentLoop entry"
        + (f" named {name!r}" if name else "")
        + f" (entries: {[entry.get('name') for entry in entries]})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m empathy_gym.integrations.verl prepare --config agents/verl/agent_loop.yaml
    --out DIR`` (or ``--personas rlver`` without a config)."""
    parser = argparse.ArgumentParser(prog="python -m empathy_gym.integrations.verl")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="write verl parquet files of dialogue starts")
    prepare.add_argument("--out", required=True, help="output folder")
    prepare.add_argument(
        "--config", help="verl agent-loop YAML (e.g. agents/verl/agent_loop.yaml) to read the env options from"
    )
    prepare.add_argument("--name", help="which entry of --config (default: the first of ours)")
    prepare.add_argument("--personas", help="persona bank: 'rlver', 'en', 'zh' or a JSONL path")
    prepare.add_argument("--env-id", help=f"registered env id (default from --config, else {ENGINE_KEYS['env_id']})")
    prepare.add_argument("--seed", type=int, default=0, help="row i gets env seed SEED + i")
    prepare.add_argument("--val-size", type=int, default=32, help="personas held out for val.parquet (0: none)")
    args = parser.parse_args(argv)
    config = load_agent_loop_config(args.config, args.name) if args.config else {}
    if args.personas:
        config["personas"] = args.personas
    if args.env_id:
        config["env_id"] = args.env_id
    paths = prepare_dataset(args.out, config, seed=args.seed, val_size=args.val_size)
    for split, path in paths.items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
