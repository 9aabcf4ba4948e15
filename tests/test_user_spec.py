"""One way to name the simulated user: ``UserSpec`` (the ``--user`` grammar, a mapping or
the dataclass), accepted by ``gym.make(..., user=...)``, recipes and the command line."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import empathy_gym  # noqa: F401  (registers the ids)
from empathy_gym.backends.base import ChatBackend
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.user import make_user
from empathy_gym.user.llm_user import LLMUser
from empathy_gym.user.rule_user import RuleUser
from empathy_gym.user.specs import SpecError, UserSpec, as_user_spec

URL = "http://127.0.0.1:9/v1"  # nothing listens; building an openai user does not connect


@pytest.mark.parametrize(
    "text,expected",
    [
        ("rule", UserSpec()),
        ("rule,rules_dir=/tmp/rules", UserSpec("rule", user_kwargs={"rules_dir": "/tmp/rules"})),
        ("transformers:/models/tiny", UserSpec("transformers", "/models/tiny")),
        (
            "hf:smollm2,device=cpu,max_tokens=8,appraisal_mode=choice",
            UserSpec(
                "transformers",
                "smollm2",
                appraisal_mode="choice",
                backend_kwargs={"device": "cpu"},
                user_kwargs={"max_tokens": 8},
            ),
        ),
        (
            "vllm:Qwen/Qwen2.5-7B-Instruct,gpu_memory_utilization=0.5,reply_plan=false",
            UserSpec(
                "vllm",
                "Qwen/Qwen2.5-7B-Instruct",
                backend_kwargs={"gpu_memory_utilization": 0.5},
                user_kwargs={"reply_plan": False},
            ),
        ),
        (
            f"openai:Qwen/Qwen2.5-72B-Instruct@{URL},max_concurrency=16,temperature=0.3,api_key_env=MY_KEY",
            UserSpec(
                "openai",
                "Qwen/Qwen2.5-72B-Instruct",
                URL,
                backend_kwargs={"max_concurrency": 16, "api_key_env": "MY_KEY"},
                user_kwargs={"temperature": 0.3},
            ),
        ),
        ("policy", UserSpec("policy")),
        (
            "policy,max_batch_size=8,prefix_cache_tokens=8192,appraisal_mode=choice,max_tokens=6",
            UserSpec(
                "policy",
                appraisal_mode="choice",
                backend_kwargs={"max_batch_size": 8, "prefix_cache_tokens": 8192},
                user_kwargs={"max_tokens": 6},
            ),
        ),
    ],
)
def test_parse_gives_the_exact_spec_and_reads_back_its_own_text(text, expected):
    spec = UserSpec.parse(text)
    assert spec == expected
    assert (spec.backend, spec.model, spec.base_url, spec.appraisal_mode, spec.backend_kwargs, spec.user_kwargs) == (
        expected.backend,
        expected.model,
        expected.base_url,
        expected.appraisal_mode,
        expected.backend_kwargs,
        expected.user_kwargs,
    )
    assert UserSpec.parse(str(spec)) == spec
    assert (
        as_user_spec(text)
        == as_user_spec(spec)
        == as_user_spec(
            {
                "backend": spec.backend,
                "model": spec.model,
                "base_url": spec.base_url,
                "appraisal_mode": spec.appraisal_mode,
                "backend_kwargs": spec.backend_kwargs,
                "user_kwargs": spec.user_kwargs,
            }
        )
        == spec
    )


def play(env, replies=("That sounds exhausting. What happened?", "I am here with you.")):
    out = [env.reset(seed=3)]
    out += [env.step(reply) for reply in replies]
    return [(step[0], step[1:]) if len(step) == 2 else step for step in out]


def test_a_string_a_mapping_and_a_userspec_give_the_same_user():
    rule = [
        gym.make("EmpathyDialogue-v0", personas="en", user=user)
        for user in ("rule", {"backend": "rule"}, UserSpec(), None)
    ]
    assert all(isinstance(env.unwrapped.user, RuleUser) for env in rule)
    assert play(rule[0]) == play(rule[1]) == play(rule[2]) == play(rule[3])
    text = f"openai:m@{URL},appraisal_mode=choice,temperature=0.3,max_concurrency=4"
    mapping = {
        "backend": "openai",
        "model": "m",
        "base_url": URL,
        "appraisal_mode": "choice",
        "user_kwargs": {"temperature": 0.3},
        "backend_kwargs": {"max_concurrency": 4},
    }
    users = [EmpathyDialogueEnv("en", user=spec).user for spec in (text, mapping, UserSpec.parse(text))]
    users.append(
        make_user(
            "openai",
            model="m",
            base_url=URL,
            appraisal_mode="choice",
            user_kwargs={"temperature": 0.3},
            backend_kwargs={"max_concurrency": 4},
        )
    )
    for user in users:
        assert isinstance(user, LLMUser) and user.owns_backend
        assert (user.appraisal_mode, user.temperature) == ("choice", 0.3)
        assert (user.backend.model, user.backend.base_url.rstrip("/"), user.backend.max_concurrency) == ("m", URL, 4)
        user.close()


def test_make_rule_equals_the_default():
    default, named = gym.make("EmpathyDialogue-v0"), gym.make("EmpathyDialogue-v0", user="rule")
    assert default.unwrapped.user_spec == named.unwrapped.user_spec == UserSpec()
    assert play(default) == play(named)
    assert default.spec.nondeterministic is False and named.spec.nondeterministic is False


def test_a_ready_user_is_shared_and_not_closed():
    user = UserSpec().build()
    closed = []
    user.close = lambda: closed.append(True)
    env = EmpathyDialogueEnv("en", user=user)
    assert env.user is user and env.user_spec is None
    env.close()
    assert closed == []


@pytest.mark.parametrize(
    "user,error,message",
    [
        ({"backend": "openai", "model": "m"}, SpecError, r"^user\.base_url: the openai backend needs the server's URL"),
        ({"backend": "transformers"}, SpecError, r"^user\.model: the transformers backend needs a model"),
        ({"backend": "gpt"}, SpecError, r"^user\.backend: unknown backend 'gpt'"),
        ({"backend": 3}, SpecError, r"^user\.backend: expected a backend name"),
        ({"appraisal_mode": "vibes"}, SpecError, r"^user\.appraisal_mode must be 'free' or 'choice', got 'vibes'"),
        ({"backend_kwargs": [1]}, SpecError, r"^user\.backend_kwargs: expected a mapping"),
        (
            {"backend": "hf", "model": "m", "user_kwargs": {"temprature": 1}},
            SpecError,
            r"^user\.user_kwargs: \['temprature'\] are not LLMUser options",
        ),
        (
            {"backend": "policy", "base_url": URL},
            SpecError,
            r"^user\.base_url: backend 'policy' is served by the policy",
        ),
        ({"backend": "vllm", "model": "m", "base_url": URL}, SpecError, r"^user\.base_url: only the openai backend"),
        ({"kind": "rule"}, SpecError, r"^user: unknown field\(s\) \['kind'\]; a user mapping takes backend, model"),
        ("openai:m,temperature=0.3", SpecError, r"expected openai:MODEL@URL"),
        ("rule:x", SpecError, r"the rule user takes no target"),
        ("hf:m,appraisal_mode=x", SpecError, r"'hf:m,appraisal_mode=x': user\.appraisal_mode must be"),
        (42, TypeError, r"^user: expected a spec string"),
    ],
)
def test_a_bad_spec_names_the_field(user, error, message):
    with pytest.raises(error, match=message):
        as_user_spec(user)
    with pytest.raises(error, match=message.lstrip("^")):
        gym.make("EmpathyDialogue-v0", user=user)


def test_policy_is_built_by_a_trainer_only():
    with pytest.raises(SpecError, match=r"user\.backend 'policy' .* a trainer builds it"):
        gym.make("EmpathyDialogue-v0", user="policy")


@pytest.mark.parametrize(
    "old",
    [
        {"backend": "openai"},
        {"model": "m"},
        {"base_url": URL},
        {"appraisal_mode": "choice"},
        {"backend_kwargs": {}},
        {"user_kwargs": {}},
    ],
)
def test_the_old_user_keywords_are_unknown_keywords(old):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(old))}'"):
        gym.make("EmpathyDialogue-v0", **old)


def test_recipes_name_the_user_with_env_kwargs_user(tmp_path):
    from empathy_gym.agents import RecipeError, load_recipe

    qwen = load_recipe(Path("agents") / "qwen2.5-7b-ppo.yaml")
    assert qwen.env.user_spec() == UserSpec(
        "openai", "Qwen/Qwen2.5-72B-Instruct", "http://localhost:8001/v1", backend_kwargs={"max_concurrency": 64}
    )
    assert load_recipe(Path("agents") / "smollm2-cpu-ppo.yaml").env.user_spec() == UserSpec()
    tiny = load_recipe(Path("agents") / "tiny-cpu.yaml", algorithm="ppo")
    assert tiny.env.user_spec() == UserSpec()  # no user: the rule user
    chosen = load_recipe(Path("agents") / "qwen2.5-7b-ppo.yaml", ["env.kwargs.user.appraisal_mode=choice"])
    assert (
        chosen.env.user_spec().appraisal_mode == "choice"
        and chosen.env.user_spec().model == qwen.env.kwargs["user"]["model"]
    )
    text = load_recipe(
        Path("agents") / "tiny-cpu.yaml",
        algorithm="ppo",
        overrides=[f"env.kwargs.user='openai:m@{URL},appraisal_mode=choice'"],
    )
    assert text.env.user_spec() == UserSpec("openai", "m", URL, appraisal_mode="choice")
    path = tmp_path / "recipe.yaml"
    path.write_text("algorithm: ppo\nenv:\n  id: EmpathyDialogue-v0\n  kwargs:\n    backend: openai\n")
    with pytest.raises(
        RecipeError,
        match=r"recipe.yaml:5: field 'env.kwargs.backend': EmpathyDialogue-v0 takes no "
        r"argument 'backend'; the simulated user is named by env.kwargs.user",
    ):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"env.kwargs.user.model: the transformers backend needs a model"):
        load_recipe(Path("agents") / "tiny-cpu.yaml", ["env.kwargs.user.backend=transformers"], algorithm="ppo")


def test_register_and_evaluate_take_any_form(tmp_path):
    from empathy_gym.evaluation.benchmark import evaluate

    spec = empathy_gym.register_persona_env("SpecClinic-v0", personas="en", user={"backend": "rule"}, override=True)
    assert spec.nondeterministic is False
    with pytest.raises(SpecError, match=r"user\.model"):
        empathy_gym.register_persona_env("SpecClinic-v0", personas="en", user={"backend": "vllm"}, override=True)
    results = [
        evaluate("baseline:listener", "en", user=user, limit=2, n_resamples=50).report
        for user in ("rule", {"backend": "rule"}, UserSpec())
    ]
    assert results[0]["sentient_score"] == results[1]["sentient_score"] == results[2]["sentient_score"]
    assert {r["config"]["user"] for r in results} == {"rule"}
    assert {r["config"]["appraisal_mode"] for r in results} == {"free"}


@pytest.mark.parametrize("command", ["eval", "replay"])
def test_the_command_line_says_the_appraisal_mode_once_in_the_user_spec(command):
    from typer.testing import CliRunner

    from empathy_gym.cli import app

    runner = CliRunner(env={"COLUMNS": "300"})  # the help's lines unwrapped
    assert "appraisal_mode (free, choice)" in runner.invoke(app, [command, "--help"]).stdout
    refused = runner.invoke(app, [command, "--appraisal-mode", "choice", "--out", "x"])
    assert refused.exit_code == 2 and "No such option: --appraisal-mode" in refused.stderr


def test_a_rule_user_spec_can_name_its_own_difficulty():
    """'rule,difficulty=challenging' (a second judge on CPU) overrides the env's difficulty
    for the user only."""
    moderate = UserSpec.parse("rule").build("moderate")
    challenging = UserSpec.parse("rule,difficulty=challenging").build("moderate")
    assert moderate.difficulty.name == "moderate" and challenging.difficulty.name == "challenging"


def test_an_llm_user_spec_can_name_its_own_difficulty():
    """Was: 'openai:M@URL,difficulty=challenging' was refused ("unknown option(s)
    ['difficulty']"), so an LLM user could judge at the env's difficulty only, and a study of
    training users of several difficulties (agents/studies/difficulty-7b.yaml) could not name
    its LLM users."""
    spec = UserSpec.parse(f"openai:m@{URL},difficulty=challenging,temperature=0.3")
    assert spec.user_kwargs == {"difficulty": "challenging", "temperature": 0.3} and not spec.backend_kwargs
    assert UserSpec.parse(str(spec)) == spec
    challenging, moderate = spec.build("moderate"), UserSpec.parse(f"openai:m@{URL}").build("moderate")
    assert isinstance(challenging, LLMUser) and challenging.difficulty.name == "challenging"
    assert moderate.difficulty.name == "moderate" and challenging.temperature == 0.3
    mapping = as_user_spec({"backend": "openai", "model": "m", "base_url": URL, "user_kwargs": {"difficulty": "easy"}})
    assert mapping.build("challenging").difficulty.name == "easy"


def test_an_option_no_user_takes_is_called_unknown():
    with pytest.raises(SpecError, match=r"user: unknown option\(s\) \['bogus'\]; the rule user takes model"):
        UserSpec.parse("rule,bogus=1").build()
    with pytest.raises(SpecError, match="the others are LLM-user options"):  # an LLM user's option on the rule user
        UserSpec.parse("rule,temperature=1").build()


@pytest.mark.parametrize("kind", ["openai:m@http://127.0.0.1:9/v1", "hf:/models/x", "vllm:/models/x"])
def test_an_option_no_llm_user_or_its_backend_takes_is_refused_before_anything_is_built(kind):
    """Was: 'max_token' (for max_tokens) went to the backend and failed as a TypeError
    traceback when it was built."""
    with pytest.raises(
        SpecError, match=r"user: unknown option\(s\) \['max_token'\]; the \w+ user takes appraisal_mode, "
    ):
        UserSpec.parse(f"{kind},max_token=32")
    assert UserSpec.parse(f"{kind},max_tokens=32").user_kwargs == {"max_tokens": 32}


@pytest.mark.parametrize("text,bad", [("rule,", "''"), ("rule,bogus", "'bogus'"), ("policy,x", "'x'")])
def test_a_malformed_option_names_the_spec_as_written(text, bad):
    """The spec is named as the user wrote it (it was shown as 'rule:,' before)."""
    with pytest.raises(SpecError, match=f"^{text!r}: option {bad} is not key=value$"):
        UserSpec.parse(text)


class EchoServer(ChatBackend):
    """Stands in for a server-backed chat backend that a user registers."""

    def __init__(self, base_url, model, timeout=1.0):
        self.base_url, self.model = base_url, model

    def _generate(self, conversations, sampling, seeds):
        return ["..." for _ in conversations]

    def choice_logprobs(self, conversations, options):
        raise NotImplementedError


def test_a_registered_backend_is_a_user_spec_everywhere(monkeypatch):
    """One call to register_backend makes a new backend a user spec: parsed, checked
    (its constructor's options, its model and URL) and built by the env (issue 38)."""
    from empathy_gym import backends

    monkeypatch.setattr(backends, "BACKENDS", dict(backends.BACKENDS))
    backends.register_backend("echo", "test_llm_user:FakeBackend")
    backends.register_backend("echoserver", "test_user_spec:EchoServer", served=True)
    spec = UserSpec.parse("echo:my-model,respond=1")
    assert (spec.backend, spec.model, spec.backend_kwargs) == ("echo", "my-model", {"respond": 1})
    served = UserSpec.parse("echoserver:m@http://127.0.0.1:9/v1")
    assert (served.model, served.base_url, str(served)) == (
        "m",
        "http://127.0.0.1:9/v1",
        "echoserver:m@http://127.0.0.1:9/v1",
    )
    with pytest.raises(SpecError, match=r"unknown option\(s\) \['nope'\]; the echo user takes .*logprobs, respond"):
        UserSpec.parse("echo:m,nope=1")
    with pytest.raises(SpecError, match=r"user\.base_url: only the openai, echoserver backends take a URL"):
        UserSpec(backend="echo", model="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(
        SpecError,
        match=r"expected one of rule, distilled\[:PATH\], transformers:PATH, .*openai:MODEL@URL, policy, "
        r"echo:PATH, echoserver:MODEL@URL$",
    ):
        UserSpec.parse("nothing:m")
    with pytest.raises(ValueError, match="must be a lower-case identifier other than"):
        backends.register_backend("rule", "x:Y")
    with pytest.raises(
        ValueError, match=r"'openai' is registered \(empathy_gym.backends.openai_backend:OpenAIBackend\)"
    ):
        backends.register_backend("openai", "test_user_spec:EchoServer")
    with pytest.raises(TypeError, match="name and target must be strings"):
        backends.register_backend(3, "x:Y")
    backends.register_backend("gone", "no_such_package.engines:Engine")
    backends.register_backend("noclass", "test_user_spec:NoSuchClass")
    backends.register_backend("notchat", "test_user_spec:_fake_backend_init")
    with pytest.raises(ImportError, match=r"backend 'gone': cannot import its target no_such_package.engines:Engine"):
        UserSpec.parse("gone:m").build()
    with pytest.raises(SpecError, match=r"user.backend: backend 'noclass': its target .* names no class"):
        UserSpec.parse("noclass:m")
    with pytest.raises(SpecError, match=r"user.backend: backend 'notchat': .* is not a ChatBackend subclass"):
        UserSpec.parse("notchat:m")
    with pytest.raises(ValueError, match="must be 'package.module:ClassName'"):
        backends.register_backend("other", "module_only")

    import test_llm_user

    monkeypatch.setattr(test_llm_user.FakeBackend, "__init__", _fake_backend_init)
    env = gym.make("EmpathyDialogue-v0", personas="en", user="echo:my-model")
    user = env.unwrapped.user
    assert isinstance(user, LLMUser) and user.backend.model == "my-model"
    env.close()
    built = UserSpec.parse("echoserver:m@http://127.0.0.1:9/v1").build()
    assert isinstance(built.backend, EchoServer) and built.backend.base_url == "http://127.0.0.1:9/v1"


def test_a_user_on_the_policys_weights_is_a_property_of_its_registry_entry(monkeypatch):
    """Every check that a 'policy' user gets reads BackendEntry.from_policy, not the name
    (issue 38): an entry of another name with the flag is parsed without a target, refused
    a model, refused outside a trainer, as a second judge, and without LoRA."""
    from empathy_gym import backends
    from empathy_gym.agents.config import RecipeError, load_recipe

    monkeypatch.setitem(backends.BACKENDS, "mine", backends.BackendEntry("test_user_spec:EchoServer", from_policy=True))
    spec = UserSpec.parse("mine,max_batch_size=8")
    assert (spec.backend, spec.on_policy, spec.backend_kwargs) == ("mine", True, {"max_batch_size": 8})
    assert backends.spec_form("mine") == "mine" and not UserSpec.parse("rule").on_policy
    with pytest.raises(SpecError, match=r"the mine user takes no target; write just 'mine'"):
        UserSpec.parse("mine:some/model")
    with pytest.raises(SpecError, match=r"user.model: backend 'mine' is served by the policy's own model"):
        UserSpec("mine", model="m")
    with pytest.raises(SpecError, match=r"user.backend 'mine' is the policy's own base model"):
        spec.build()
    with pytest.raises(ValueError, match=r"backend='mine' is the policy's own base model"):
        backends.make_backend("mine")
    with pytest.raises(RecipeError, match=r"heldout.user 'mine' would run on the policy being judged"):
        load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en", "heldout.user=mine"], algorithm="grpo")
    with pytest.raises(RecipeError, match=r"env.kwargs.user 'mine' \(the simulated user on the policy's base"):
        load_recipe("agents/tiny-cpu.yaml", ["env.kwargs.user=mine", "policy.use_lora=false"], algorithm="grpo")


def _fake_backend_init(self, model, respond=None, logprobs=None):
    self.model, self.respond, self.logprobs = model, respond, logprobs
    self.generate_calls, self.choice_calls = [], []


def test_make_backend_of_a_user_kind_that_is_not_a_backend():
    """Was: "unknown backend 'rule'; known: [..., 'policy'] (or 'rule' for no LLM)", which
    called 'rule' unknown, offered it, and offered 'policy', which make_backend refuses."""
    from empathy_gym.backends import make_backend

    with pytest.raises(
        ValueError, match=r"^'rule' is not a chat backend; known: \['transformers', 'vllm', 'openai'\]; "
    ):
        make_backend("rule")
    with pytest.raises(
        ValueError, match=r"^unknown backend 'gpt'; known: \['transformers', 'vllm', 'openai'\]; the rule"
    ):
        make_backend("gpt")
