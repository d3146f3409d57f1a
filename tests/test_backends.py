"""The generation-backend seam (issue 24 §2): the ``Backend`` base and its declared capabilities, the
registry that alone knows backend names, ``as_backend`` for protocol-only user policies, and the one
placement function (colocated, separate engine, ``max_staleness``)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from agentgym.algorithms.loop.train_config import TrainConfig
from agentgym.policies import backends
from agentgym.backend import Backend, ProtocolBackend, TokenBackend, as_backend, tokenizer_of
from agentgym.policies.loading import load_policy, load_tokenizer_for
from agentgym.policies.openai_policy import OpenAIChatPolicy
from agentgym.policies.placement import place_sampler
from agentgym.policies.ray_pool import RayPolicyPool
from agentgym.policies.scripted import ScriptedPolicy
from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import Generation, SamplingParams
from agentgym.precision import resolve_precision
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine

SAMPLING = SamplingParams(max_new_tokens=12)
REPLY = "<answer>4</answer>"


class ProtocolOnly:
    """A user's policy with only what the Policy protocol asks: tokenizer and generate."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = 0

    def generate(self, prompts, sampling):
        self.calls += 1
        ids = self.tokenizer.encode(REPLY, add_special_tokens=False)
        return [Generation(list(ids), [0.0] * len(ids), REPLY, "stop") for _ in prompts]


class WithCache(ProtocolOnly):
    cleared = 0

    def clear_kv_cache(self):
        self.cleared += 1


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer_for("tiny-random")


def test_builtin_backends_declare_their_capabilities():
    assert backends.backend_names()[0] == "hf" and "vllm" in backends.backend_names()
    hf = backends.backend_class("hf")
    assert hf is TransformersPolicy and issubclass(hf, Backend)
    assert hf.trains_in_place and hf.supports_weight_sync and hf.follows_run_precision and not hf.separate_engine
    assert RayPolicyPool.separate_engine and RayPolicyPool.supports_weight_sync and not RayPolicyPool.trains_in_place
    assert not OpenAIChatPolicy.token_level and OpenAIChatPolicy.answers_chat and not OpenAIChatPolicy.supports_weight_sync
    assert ScriptedPolicy.needs_context and not ScriptedPolicy.supports_weight_sync
    try:
        vllm = backends.backend_class("vllm")
    except backends.BackendUnavailable:
        return  # vLLM is not installed here: its flags are checked where it is (tests/test_vllm_policy.py runs it)
    assert vllm.separate_engine and vllm.supports_weight_sync and vllm.engine_bf16_with_run


def test_registry_checks_names_and_options_and_specs_pick_their_own_backend():
    with pytest.raises(ValueError, match="unknown backend 'tgi'"):
        backends.backend_class("tgi")
    with pytest.raises(ValueError, match="backend must be hf, vllm"):
        backends.check_backend("tgi")
    with pytest.raises(ValueError, match=r"unknown hf backend option\(s\) \['bogus'\]"):
        backends.check_backend("hf", {"bogus": 1})
    backends.check_backend(None, {"anything": 1})          # resolved later, as before
    with pytest.raises(ValueError, match="backend must be"):
        TrainConfig(backend="tgi")
    with pytest.raises(ValueError, match="unknown backend 'tgi'; choose from hf, vllm"):   # any spec, even oracle
        load_policy("oracle", "tgi", env_id="Arithmetic-v0")
    assert backends.trainable_backend() == "hf"
    assert backends.names_own_backend("oracle") and backends.names_own_backend("openai:m@http://x")
    assert not backends.names_own_backend("tiny-random")
    oracle = load_policy("oracle", env_id="Arithmetic-v0")
    assert isinstance(oracle, ScriptedPolicy) and oracle.wants_context is True
    hosted = load_policy("openai:qwen@http://127.0.0.1:9/v1")
    assert isinstance(hosted, OpenAIChatPolicy) and tokenizer_of(hosted) is None and isinstance(hosted, Backend)
    hosted.close()
    with pytest.raises(ValueError, match="openai:MODEL@BASE_URL"):
        load_policy("openai:qwen")


def test_a_protocol_only_policy_runs_and_gets_the_rest_from_the_base(tok):
    user = ProtocolOnly(tok)
    seen = as_backend(user)
    assert isinstance(seen, ProtocolBackend) and seen.token_level and not seen.needs_context
    assert not seen.supports_weight_sync and not seen.answers_chat
    seen.clear_kv_cache()
    seen.close()                                            # no-ops: the object has neither
    with pytest.raises(NotImplementedError, match="cannot take new weights"):
        seen.sync_weights([])
    engine = RolloutEngine(user, RolloutConfig(sampling=SAMPLING))
    result = engine.collect("Arithmetic-v0", num_groups=2, group_size=1, seed=0)
    engine.close()
    assert user.calls >= 1 and engine.policy is user
    assert [t.messages[-1]["content"] for t in result.trajectories] == [REPLY, REPLY]
    cached = WithCache(tok)                                 # what the object has is used
    engine = RolloutEngine(cached, RolloutConfig(sampling=SAMPLING))
    engine.collect("Arithmetic-v0", num_groups=1, group_size=1, seed=0)
    engine.close()
    assert cached.cleared == 1
    assert as_backend(TransformersPolicy.tiny_random(seed=0)).trains_in_place   # a Backend is itself
    with pytest.raises(TypeError, match="needs generate"):
        RolloutEngine(SimpleNamespace(tokenizer=None))


def _cfg(**kw):
    return TrainConfig(model="tiny-random", output_dir="unused", **kw)


def test_placement_keeps_the_rules():
    fp32 = resolve_precision("fp32", "cpu")
    train, sampler = place_sampler(_cfg(), "hf", fp32)
    assert sampler is train and isinstance(train, TransformersPolicy)          # colocated
    assert train.precision.name == "fp32"
    given = TransformersPolicy.tiny_random(seed=0)
    assert place_sampler(_cfg(), "hf", fp32, given) == (given, given)
    # max_staleness > 0: the next batch is generated while the learner steps, so a separate hf copy
    train, sampler = place_sampler(_cfg(max_staleness=1), "hf", fp32, given)
    assert train is given and isinstance(sampler, TransformersPolicy) and sampler is not given
    assert sampler.precision.name == "fp32"
    assert sampler.model is not given.model


def test_a_policy_handed_in_generates_at_the_run_precision():
    """agentgym compare hands the trainer a fresh copy of a loaded policy (fp32 by default): trained in place, it
    must sample under the run's precision, as when the trainer loads the model itself (it once stayed fp32 while
    the learner ran bf16, so compare's runs sampled differently from agentgym train's)."""
    given = TransformersPolicy.tiny_random(seed=0)
    assert given.precision.name == "fp32"
    train, sampler = place_sampler(_cfg(), "hf", resolve_precision("bf16", "cpu"), given)
    assert train is given and sampler is given and given.precision.name == "bf16"
    place_sampler(_cfg(), "hf", resolve_precision("fp32", "cpu"), given)
    assert given.precision.name == "fp32"
    with pytest.raises(ValueError, match="resolved fp32 or bf16"):
        given.use_precision("auto")


def test_the_trainer_samples_a_handed_in_policy_under_bf16_autocast(tmp_path, monkeypatch):
    """End to end through the Trainer, as agentgym compare runs it: generation sees bf16 autocast."""
    import torch
    from agentgym.algorithms.loop.trainer import Trainer
    given = TransformersPolicy.tiny_random(seed=0)
    seen = []
    real = given._generate_batch
    def spy(*a, **k):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return real(*a, **k)
    monkeypatch.setattr(given, "_generate_batch", spy)
    cfg = TrainConfig(model="tiny-random", env="Arithmetic-v0", env_kwargs={}, steps=1, groups_per_step=1,
                      group_size=2, precision="bf16", output_dir=str(tmp_path / "run"), checkpoint_every=0,
                      tensorboard=False)
    trainer = Trainer(cfg, policy=given, log=lambda m: None)
    assert trainer.policy is given and given.precision.name == "bf16"
    trainer.engine.collect("Arithmetic-v0", num_groups=1, group_size=2, seed=0)
    assert seen and all(seen)


def test_a_backend_that_cannot_take_weights_is_refused_for_training_but_evaluates(tok):
    class Frozen(TokenBackend):
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        @classmethod
        def from_spec(cls, spec, **_):
            return cls(load_tokenizer_for(spec))

        def generate(self, prompts, sampling):
            return ProtocolOnly(self.tokenizer).generate(prompts, sampling)

    backends.register_backend("frozen-test", Frozen)
    try:
        assert "frozen-test" in backends.backend_names()
        assert backends.resolve_backend("frozen-test") == "frozen-test"
        with pytest.raises(ValueError, match="cannot take a learner's weights"):
            place_sampler(_cfg(backend="frozen-test"), "frozen-test", resolve_precision("fp32", "cpu"),
                          TransformersPolicy.tiny_random(seed=0))
        engine = RolloutEngine(load_policy("tiny-random", "frozen-test"), RolloutConfig(sampling=SAMPLING))
        trajs = engine.collect("Arithmetic-v0", num_groups=1, group_size=1, seed=0).trajectories
        engine.close()
        assert trajs[0].messages[-1]["content"] == REPLY
    finally:
        del backends.POLICY_BACKENDS["frozen-test"]


def test_cli_takes_a_backend_an_import_module_registers(tmp_path):
    (tmp_path / "mybackend.py").write_text(
        "from agentgym.backend import TokenBackend\n"
        "from agentgym.policies.loading import load_tokenizer_for\n"
        "from agentgym.policies.backends import register_backend\n"
        "from agentgym.policy import Generation\n"
        "class Fixed(TokenBackend):\n"
        "    def __init__(self, tok): self.tokenizer = tok\n"
        "    @classmethod\n"
        "    def from_spec(cls, spec, **_): return cls(load_tokenizer_for(spec))\n"
        "    def generate(self, prompts, sampling):\n"
        "        ids = self.tokenizer.encode('<answer>4</answer>', add_special_tokens=False)\n"
        "        return [Generation(ids, [0.0] * len(ids), '<answer>4</answer>', 'stop') for _ in prompts]\n"
        "register_backend('fixed', Fixed)\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "agentgym.app.cli", *a], cwd=tmp_path,  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    res = run("--import", "mybackend", "eval", "Arithmetic-v0", "--policy", "tiny-random", "--backend", "fixed",
              "--episodes", "2", "--max-new-tokens", "12")
    assert res.returncode == 0, res.stderr[-2000:]
    res = run("eval", "Arithmetic-v0", "--policy", "tiny-random", "--backend", "fixed", "--episodes", "1")
    assert res.returncode == 2 and "unknown backend 'fixed'" in res.stderr
