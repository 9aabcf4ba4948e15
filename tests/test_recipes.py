"""The recipes in agents/: every one loads, the GPU ones carry RLVER's settings, and a bad
recipe or override is refused with the file, line and field."""

import re
from pathlib import Path

import pytest

from empathy_gym.agents import GRPOConfig, PPOConfig, load_recipe
from empathy_gym.agents.config import RecipeError

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted(Path("agents").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_loads(path):
    algorithm = None if re.search(r"^algorithm:", path.read_text(), re.M) else "ppo"
    assert isinstance(load_recipe(path, [], algorithm=algorithm), (PPOConfig, GRPOConfig))


@pytest.mark.parametrize("name,algorithm", [("qwen2.5-7b-ppo.yaml", PPOConfig), ("qwen2.5-7b-grpo.yaml", GRPOConfig)])
def test_the_qwen_recipes_carry_rlvers_settings(name, algorithm):
    """RLVER (arXiv 2507.03112) section 4.1 and its launcher: 32 profiles a step (x 4 for
    GRPO), one optimiser step a step, clip 0.2, entropy 0.001, no KL, gamma = lambda = 1,
    temperature 1.0, reward e_T / 100 at the end of an 8-turn dialogue starting at emotion
    30. One GPU: LoRA on bfloat16."""
    config = load_recipe(Path("agents") / name)
    assert isinstance(config, algorithm)
    assert config.policy.model == "Qwen/Qwen2.5-7B-Instruct" and config.policy.dtype == "bfloat16"
    assert config.policy.use_lora and config.policy.gradient_checkpointing
    assert config.rollout_batch_size == (32 if algorithm is PPOConfig else 128) and config.entropy_coef == 0.001
    assert config.num_mini_batches == 1 and config.warmup_ratio == 0.02
    assert config.generation.temperature == 1.0 and config.generation.engine == "vllm"
    assert config.env.kwargs["protocol"] == "rlver_training" and config.env.kwargs["reward_mode"] == "final"
    if algorithm is PPOConfig:
        assert (config.cliprange, config.kl_coef, config.gamma, config.lam) == (0.2, 0.0, 1.0, 1.0)
        assert config.critic == "separate"
    else:
        assert (config.epsilon, config.beta, config.num_generations) == (0.2, 0.0, 4)


def recipe_table() -> list[tuple[str, str, str]]:
    """``(our key, ours PPO, ours GRPO)`` of agents/README.md's table, for rows that name
    one key."""
    rows = []
    for line in Path("agents/README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"`[\w.]+`", cells[0]):
            rows.append((cells[0].strip("`"), cells[3], cells[4]))
    return rows


def cell_value(cell: str):
    import yaml

    value = yaml.safe_load(cell.replace("`", "").split(" (")[0].split(" each")[0])
    try:
        return float(value) if isinstance(value, str) else value  # YAML 1.1 reads 1e-5 as text
    except ValueError:
        return value


@pytest.mark.parametrize("name,column", [("qwen2.5-7b-ppo.yaml", 1), ("qwen2.5-7b-grpo.yaml", 2)])
def test_the_rlver_table_says_what_the_recipes_hold(name, column):
    from empathy_gym.agents.config import to_dict

    config = to_dict(load_recipe(Path("agents") / name))
    rows = recipe_table()
    assert len(rows) >= 15
    for row in rows:
        if row[column] == "-":
            continue
        value = config
        for part in row[0].split("."):
            value = value[part]
        assert value == cell_value(row[column]), (name, row)


def write(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "algorithm: ppo\nseed: 0\npolicy:\n  model: tiny\n  lora_rr: 3\n",
            r"recipe.yaml:5: field 'policy.lora_rr': Key 'lora_rr' not in 'PolicyConfig'",
        ),
        ("algorithm: ppo\nseed: zero\n", r"recipe.yaml:2: field 'seed': Value 'zero'"),
        ("algorithm: ppo\nseed: [0\n", r"recipe.yaml:3: not valid YAML"),
        # was: the second learning_rate won silently
        (
            "algorithm: ppo\nlearning_rate: 1.0e-5\npolicy:\n  lora_r: 4\nlearning_rate: 1.0\n",
            r"recipe.yaml:5: not valid YAML: field 'learning_rate' given twice \(first on line 2\)",
        ),
        ("algorithm: ppo\npolicy:\n  lora_r: 4\n  lora_r: 8\n", r"recipe.yaml:4: .*'lora_r' given twice"),
        ("seed: 0\n", r"recipe.yaml: no field 'algorithm'"),
        ("algorithm: a2c\n", r"field 'algorithm': expected one of \['grpo', 'ppo'\], got 'a2c'"),
        ("algorithm: ppo\npolicy:\n  dtype: half\n", r"policy.dtype must be 'float32', 'bfloat16' or 'auto'"),
        ("algorithm: ppo\npolicy:\n  dtype: float16\n", r"float16 would need loss scaling"),
        (
            "algorithm: ppo\nmax_grad_norm: -1\nnum_ppo_epochs: 0\nseed: -5\n",
            r"recipe.yaml:2: max_grad_norm must be > 0, got -1.0; \S*recipe.yaml:3: num_ppo_epochs must be > 0, got 0; "
            r"\S*recipe.yaml:4: seed must be >= 0, got -5",
        ),
        (
            "algorithm: grpo\nnum_generations: 0\nnum_mini_batches: 0\n",
            r"recipe.yaml:3: num_mini_batches must be > 0, got 0; \S*recipe.yaml:2: num_generations must be > 0, got 0",
        ),
        (
            "algorithm: ppo\ngeneration:\n  temperature: -1\n  top_p: 5\n  max_new_tokens: 0\n",
            r"recipe.yaml:5: generation.max_new_tokens must be >= 1, got 0; \S*recipe.yaml:3: generation.temperature "
            r"must be > 0, got -1.0; \S*recipe.yaml:4: generation.top_p must be in \(0, 1\], got 5.0",
        ),
        (  # was: think_budget did not exist, and a turn could never be made to think
            "algorithm: ppo\ngeneration:\n  think_budget: 8\n",
            r"recipe.yaml:3: generation.think_budget forces the end of a <think> block; it needs generation.think=true",
        ),
        (
            "algorithm: ppo\ngeneration:\n  think: true\n  max_new_tokens: 8\n  think_budget: 8\n",
            r"recipe.yaml:5: generation.think_budget must be in \[1, generation.max_new_tokens=8\), got 8",
        ),
        (
            "algorithm: ppo\nenv:\n  id: EmpathyDialog-v0\n",
            r"recipe.yaml:3: field 'env.id': Environment `EmpathyDialog` doesn't exist. "
            r"Did you mean: `EmpathyDialogue`\?",
        ),
        (
            "algorithm: ppo\nenv:\n  id: EmpathyDialogue-v0\n  kwargs:\n    max_turn: 2\n",
            r"recipe.yaml:5: field 'env.kwargs.max_turn': EmpathyDialogue-v0 takes no argument 'max_turn'; "
            r"did you mean 'max_turns'\?",
        ),
        (  # before: refused by the trainer, after the policy loaded, with no file or line
            "algorithm: ppo\nenv:\n  kwargs:\n    reward_mode: delta\n    max_turns: -1\n",
            r"recipe.yaml:5: field 'env.kwargs.max_turns': max_turns must be >= 1, got -1",
        ),
        (
            "algorithm: ppo\nenv:\n  kwargs:\n    protocol: nope\n",
            r"recipe.yaml:4: field 'env.kwargs.protocol': unknown protocol 'nope'; known: \['rlver_training', 'sage'\]",
        ),
        ("algorithm: ppo\nlearning_rate: -1\n", r"recipe.yaml:2: learning_rate must be > 0, got -1.0"),
        (
            "algorithm: grpo\nseed: 1\nloss_type: mean\n",
            r"recipe.yaml:3: field 'loss_type': Invalid value 'mean', "
            r"expected one of \[token_mean, sequence_mean, dr_grpo\]",
        ),
        (
            "algorithm: ppo\ngeneration:\n  engine: sglang\n",
            r"recipe.yaml:3: field 'generation.engine': Invalid value 'sglang', expected one of \[transformers, vllm\]",
        ),
        (
            "algorithm: ppo\nrollout_batch_size: 16\nnum_mini_batches: 3\n",
            r"recipe.yaml:2: rollout_batch_size \(16\) must be a multiple of num_mini_batches \(3\)",
        ),
    ],
)
def test_a_bad_recipe_names_the_file_line_and_field(tmp_path, text, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(write(tmp_path, text))


def test_a_bad_override_or_algorithm_is_named():
    # before: a value out of range named no place ("generation.temperature must be ...")
    with pytest.raises(RecipeError, match=r"command-line override: generation.temperature must be > 0, got -1.0"):
        load_recipe("agents/tiny-cpu.yaml", ["generation.temperature=-1"], algorithm="ppo")
    with pytest.raises(RecipeError, match=r"command-line override: field 'env.kwargs.think': think must be True or"):
        load_recipe("agents/tiny-cpu.yaml", ["env.kwargs.think=maybe"], algorithm="ppo")
    with pytest.raises(RecipeError, match=r"command-line override 'policy.lora_r': Value 'x'"):
        load_recipe("agents/tiny-cpu.yaml", ["policy.lora_r=x"], algorithm="ppo")
    with pytest.raises(
        RecipeError,
        match=r"qwen2.5-7b-ppo.yaml:\d+: field 'algorithm': the recipe is for 'ppo', "
        r"this script trains 'grpo'",
    ):
        load_recipe("agents/qwen2.5-7b-ppo.yaml", algorithm="grpo")


@pytest.mark.parametrize(
    "override,message",
    [  # before (a newcomer's finds): a traceback, the wrong field, or accepted until the trainer built the envs
        ("env.kwargs.personas=/tmp", r"field 'env.kwargs.personas': .*Is a directory: '/tmp'"),
        ("env.personas=nope", r"field 'env.personas': no persona bank 'nope': not a file, and not a built-in bank"),
        ("env.kwargs.user=rule,difficulty=bogus", r"field 'env.kwargs.user': unknown difficulty 'bogus'; known: "),
        (  # an LLM user's own difficulty (checked only for the rule and distilled users before)
            "env.kwargs.user='openai:m@http://127.0.0.1:9/v1,difficulty=bogus'",
            r"field 'env.kwargs.user': unknown difficulty 'bogus'; known: ",
        ),
        ("env.kwargs.protocol=123", r"field 'env.kwargs.protocol': protocol must be a preset name .* got 123"),
        ("env.kwargs=[1]", r" 'env.kwargs=\[1\]': Cannot merge incompatible container types"),
    ],
)
def test_a_bad_env_value_is_refused_at_load_naming_its_field(override, message):
    with pytest.raises(RecipeError, match=r"command-line override.*" + message):
        load_recipe("agents/tiny-cpu.yaml", [override], algorithm="ppo")


def test_changed_settings_lists_every_differing_dotted_key():
    from empathy_gym.agents.trainer import changed_settings

    saved = {"learning_rate": 0.01, "policy": {"lora_r": 8, "dtype": "float32"}, "seed": 0}
    now = {"learning_rate": 0.3, "policy": {"lora_r": 8, "dtype": "bfloat16"}, "seed": 0, "new": 1}
    assert changed_settings(saved, now) == [
        "learning_rate: 0.01 -> 0.3",
        "new: None -> 1",
        "policy.dtype: 'float32' -> 'bfloat16'",
    ]


def test_a_recipe_that_is_not_utf8(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_bytes("algorithm: ppo\noutput_dir: runs/zoé\n".encode("latin-1"))
    with pytest.raises(RecipeError, match=r"recipe.yaml: not valid UTF-8 \(byte 0xe9 at offset 34\)"):
        load_recipe(path)


def test_several_processes_need_even_groups_and_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RecipeError, match=r"5 dialogue groups per step do not split evenly over 2 processes"):
        load_recipe("agents/tiny-cpu.yaml", ["rollout_batch_size=5"], algorithm="ppo")
    with pytest.raises(
        RecipeError,
        match=r"3 dialogue groups per step do not split evenly over 2 processes; .*"
        r"several processes need generation.engine='transformers'",
    ):
        load_recipe(
            "agents/tiny-cpu.yaml",
            ["rollout_batch_size=6", "num_generations=2", "generation.engine=vllm"],
            algorithm="grpo",
        )
    assert load_recipe("agents/tiny-cpu.yaml", ["rollout_batch_size=8", "num_generations=2"], algorithm="grpo")


def test_an_override_is_named_as_the_override():
    with pytest.raises(
        RecipeError,
        match=r"^command-line override: field 'env.id': Environment version `v9` "
        r"for environment `EmpathyDialogue` doesn't exist",
    ):
        load_recipe("agents/tiny-cpu.yaml", ["env.id=EmpathyDialogue-v9"], algorithm="ppo")


def test_the_main_recipe_trains_and_evaluates_on_english_personas():
    """The README's main command: SmolLM2 (English) on the built-in English bank, with
    the held-out before/after evaluation on personas split off it."""
    from empathy_gym.personas import load_personas

    config = load_recipe("agents/smollm2-cpu-grpo.yaml")
    assert isinstance(config, GRPOConfig) and config.policy.model == "smollm2"
    assert config.heldout.bank == "en" and config.env.personas is None
    assert {p.language for p in load_personas(config.heldout.bank)} == {"en"}
    assert config.generation.temperature == 1.0 and config.generation.top_p == 1.0


def test_a_shipped_recipe_is_found_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no agents/ folder here
    by_path = load_recipe(ROOT / "agents" / "smollm2-cpu-grpo.yaml")
    for name in ("smollm2-cpu-grpo", "smollm2-cpu-grpo.yaml", "agents/smollm2-cpu-grpo.yaml"):
        assert load_recipe(name) == by_path
    with pytest.raises(FileNotFoundError, match="no recipe 'smollm2-gpu'.*smollm2-cpu-grpo"):
        load_recipe("smollm2-gpu")


def test_a_config_built_in_python_refuses_a_value_outside_its_choices():
    with pytest.raises(
        RecipeError,
        match=r"field 'loss_type': expected one of \['token_mean', 'sequence_mean', "
        r"'dr_grpo'\], got 'mean'",
    ):
        GRPOConfig(loss_type="mean")
    config = GRPOConfig(loss_type="dr_grpo")  # a member that is its string
    assert config.loss_type == "dr_grpo" and f"{config.loss_type}" == "dr_grpo"


@pytest.mark.parametrize("field", ["env.kwargs.personas", "env.personas"])
def test_training_personas_named_beside_a_held_out_bank_are_refused_not_ignored(field):
    """The held-out split used to replace them without a word (a newcomer's override
    trained on the recipe's bank)."""
    with pytest.raises(RecipeError, match=rf"{field}=zh and heldout.bank=en both choose the training personas"):
        load_recipe("agents/smollm2-cpu-grpo.yaml", [f"{field}=zh"], algorithm="grpo")
    config = load_recipe("agents/smollm2-cpu-grpo.yaml", [f"{field}=zh", "heldout.bank=null"], algorithm="grpo")
    assert config.heldout.bank is None


def test_an_override_without_a_value_is_refused_as_such():
    with pytest.raises(RecipeError, match=r"command-line override 'total_steps': expected KEY=VALUE"):
        load_recipe("agents/tiny-cpu.yaml", ["total_steps"], algorithm="ppo")


def test_each_algorithm_names_its_kl_weight_and_warmups():
    """The trainer and the memory plan read these instead of getattr on the other
    algorithm's field names (issue 38)."""
    ppo = load_recipe("agents/tiny-cpu.yaml", ["kl_coef=0.05", "critic_warmup_ratio=0.1"], algorithm="ppo")
    assert ppo.kl_weight == 0.05 and ppo.warmup_ratios == {"policy": ppo.warmup_ratio, "value": 0.1}
    grpo = load_recipe("agents/tiny-cpu.yaml", ["beta=0.02"], algorithm="grpo")
    assert grpo.kl_weight == 0.02 and grpo.warmup_ratios == {"policy": grpo.warmup_ratio}


def test_the_env_config_reads_its_user_reward_and_gym_keywords_in_one_place():
    """``EnvConfig`` is the one reading of ``env``: the Qwen recipe's user, RLVER's final
    reward (``reward_mode: final``), ``env.personas`` over ``env.kwargs.personas`` and an
    override over both; a bad reward is Reward's error."""
    from empathy_gym.agents.config import EnvConfig
    from empathy_gym.reward import Reward
    from empathy_gym.user.specs import UserSpec

    qwen = load_recipe(Path("agents") / "qwen2.5-7b-grpo.yaml").env
    assert qwen.reward() == Reward("final") and qwen.user_spec().model == "Qwen/Qwen2.5-72B-Instruct"
    env = EnvConfig(personas="sage", kwargs={"personas": "en", "max_turns": 3, "reward_shaping": 0.5})
    assert env.gym_kwargs() == {"personas": "sage", "max_turns": 3, "reward_shaping": 0.5}
    assert env.gym_kwargs(personas="rlver", user="rule")["personas"] == "rlver"
    assert env.kwargs["personas"] == "en"  # not rewritten
    assert env.user_spec() == UserSpec()
    with pytest.raises(ValueError):
        env.reward()  # shaping needs reward_mode final
    assert EnvConfig(kwargs={"reward_mode": "final", "reward_shaping": 0.5}).reward() == Reward("final", 0.5)
    with pytest.raises(RecipeError, match=r"env\.kwargs\.user"):
        EnvConfig(kwargs={"user": "nonsense-backend:x"}).user_spec()


def test_anchors_and_merge_keys_are_not_repeated_keys(tmp_path):
    """Was: a mapping merged into another (``<<: *b``) after PyYAML had flattened it was
    refused as giving its keys twice."""
    from empathy_gym.agents.config import read_yaml

    merged = read_yaml(write(tmp_path, "a: &a {x: 1}\nk:\n  b: &b {<<: *a, x: 2}\nc: {<<: *b}\nd: {<<: [*a], y: 3}\n"))
    assert merged["k"]["b"] == {"x": 2} and merged["d"] == {"x": 1, "y": 3}
    assert read_yaml(write(tmp_path, "1: a\n'1': b\n")) == {1: "a", "1": "b"}  # YAML's keys differ: an int, a string
    with pytest.raises(RecipeError, match=r"recipe.yaml:3: .*'x' given twice \(first on line 3\)"):
        read_yaml(write(tmp_path, "a:\n  - {x: 1}\n  - {x: 1, x: 2}\n"))  # inside a list too
