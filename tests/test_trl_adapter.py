"""TRL's GRPOTrainer on an agentgym env through ``agentgym.algorithms.offline.trl_adapter``.

One short real run (a tiny random Llama with the SmolLM2 tokenizer, 2 steps on the CPU, Arithmetic-v0
with two turns, so every completion holds environment tokens between policy turns) is shared by the
tests (with a KL term, beta > 0, so the reference-model path is covered too). A GRPOTrainer subclass
records what TRL's loss sees: the mask it multiplies the per-token loss (policy term + KL) with, and
the gradients of the per-token log-probs and of the final hidden states (the logits are a linear
function of those; TRL's fused LM head never materialises logits). The env-token masking is checked
on those, not assumed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
trl = pytest.importorskip("trl")

from fixtures_llm import assert_faithful, cached_tokenizer, one_torch_thread  # noqa: E402,F401 (autouse fixture)

from agentgym.algorithms.offline.trl_adapter import (EnvRollout, episode_reward, make_task_dataset,  # noqa: E402
                                             prompt_key, train_with_trl)
from agentgym.policies.transformers_policy import TransformersPolicy  # noqa: E402

ENV = "Arithmetic-v0"
ENV_KWARGS = {"max_turns": 2, "hard_fraction": 0.0}
TEMPERATURE = 0.7   # not 1: TRL must recompute log-probs at the temperature the episodes were sampled with


def first_action_chars(trajectory, **_):
    """A second reward that varies with the sampled text, so group advantages are non-zero (a random
    model fails every Arithmetic episode the same way) and the policy gradient is not trivially 0."""
    return [len(t.actions[0]) / 10 for t in trajectory]


def _capturing_trainer_class():
    class CapturingGRPOTrainer(trl.GRPOTrainer):
        """Records each rollout_func output and, per loss call, TRL's inputs and the tensors whose
        gradients show which positions the loss depends on."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rollouts: list[dict] = []
            self.losses: list[dict] = []
            inner = self.rollout_func

            def recording(prompts, trainer):
                out = inner(prompts, trainer)
                self.rollouts.append(out)
                return out
            self.rollout_func = recording
            self._hidden: list[torch.Tensor] = []
            self._logps: list[torch.Tensor] = []
            self.model.model.norm.register_forward_hook(self._keep_hidden)

        def _keep_hidden(self, module, args, output):
            if output.requires_grad:
                output.retain_grad()
                self._hidden.append(output)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if logps.requires_grad:
                logps.retain_grad()
                self._logps.append(logps)
            return logps, entropies, aux

        def _compute_loss(self, model, inputs):
            self._hidden.clear()
            self._logps.clear()
            loss = super()._compute_loss(model, inputs)
            assert len(self._hidden) == len(self._logps) == 1
            self.losses.append({"inputs": {k: v for k, v in inputs.items() if torch.is_tensor(v)},
                                "hidden": self._hidden[0], "logps": self._logps[0]})
            return loss
    return CapturingGRPOTrainer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    policy = TransformersPolicy.tiny_random(cached_tokenizer(), seed=0)
    before = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    out = train_with_trl(ENV, policy, steps=2, num_generations=2, prompts_per_step=2, env_kwargs=ENV_KWARGS,
                         max_new_tokens=6, temperature=TEMPERATURE, learning_rate=1e-3, beta=0.04, seed=0,
                         output_dir=tmp_path_factory.mktemp("trl"), reward_funcs=[first_action_chars],
                         debug_checks=True, trainer_class=_capturing_trainer_class())
    out["weights_before"] = before
    return out


def test_task_dataset_maps_prompts_to_tasks():
    ds = make_task_dataset(ENV, 5, env_kwargs=ENV_KWARGS, first_task=3)
    assert ds.column_names == ["prompt", "task_index", "env_id"]
    assert len({prompt_key(p) for p in ds["prompt"]}) == 5
    assert ds["task_index"][0] == 3 and ds["task_index"] == sorted(ds["task_index"])
    rollout = EnvRollout(ENV, env_kwargs=ENV_KWARGS, dataset=ds)
    for prompt, index in zip(ds["prompt"], ds["task_index"]):
        assert rollout.task_index(prompt) == index
        assert prompt[-1]["role"] == "user" and prompt[-1]["content"].startswith("What is")
    with pytest.raises(KeyError, match="not found"):
        rollout.task_index([{"role": "user", "content": "not a task of this dataset"}])
    from datasets import Dataset
    ambiguous = Dataset.from_dict({"prompt": [ds["prompt"][0]] * 2, "task_index": [3, 4]})
    with pytest.raises(ValueError, match="ambiguous"):
        EnvRollout(ENV, dataset=ambiguous)


def test_refuses_trl_settings_that_would_break_the_contract():
    ok = dict(mask_truncated_completions=False, use_vllm=False, repetition_penalty=1.0, min_p=None,
              generation_kwargs=None)
    EnvRollout.check_trainer(SimpleNamespace(tools=[], args=SimpleNamespace(**ok)))
    for bad in ({"mask_truncated_completions": True}, {"use_vllm": True}, {"repetition_penalty": 1.1}):
        with pytest.raises(ValueError, match="cannot honour"):
            EnvRollout.check_trainer(SimpleNamespace(tools=[], args=SimpleNamespace(**{**ok, **bad})))
    with pytest.raises(ValueError, match="ignores env_mask"):
        EnvRollout.check_trainer(SimpleNamespace(tools=[print], args=SimpleNamespace(**ok)))


def test_train_with_trl_runs_and_reports_per_step_rewards(run):
    history, trainer = run["history"], run["trainer"]
    assert [r["step"] for r in history] == [1.0, 2.0]
    assert run["reward_curve"] == [r["rollout/reward_mean"] for r in history]
    for row, rollout in zip(history, trainer.rollouts):
        rewards = [t.total_reward for t in rollout["trajectory"]]
        assert row["rollout/episodes"] == 4 and row["rollout/turns_mean"] == 2.0
        assert row["rollout/reward_mean"] == pytest.approx(sum(rewards) / 4)
        # the env's episode reward is what TRL logged for our reward function
        assert row["train/rewards/episode_reward/mean"] == pytest.approx(sum(rewards) / 4, abs=1e-6)
        assert rollout["env_reward"] == rewards
        assert "train/loss" in row and "time/step_s" in row
    saved = json.loads((Path(run["output_dir"]) / "history.json").read_text())
    assert [r["step"] for r in saved] == [1.0, 2.0]
    # TRL's optimizer changed the policy's weights (the same module the episodes are sampled from)
    after = run["policy"].model.state_dict()
    assert any(not torch.equal(v, after[k]) for k, v in run["weights_before"].items())
    # the KL reference (beta > 0) is the policy as it was given, not whatever its config's path names
    reference = trainer.accelerator.unwrap_model(trainer.ref_model).state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in run["weights_before"].items())
    assert "train/kl" in history[-1]


def test_trl_loss_is_zero_exactly_on_env_tokens(run):
    trainer = run["trainer"]
    assert len(trainer.losses) == 2
    by_ids = {(tuple(t.token_ids[:t.prompt_length]), tuple(t.token_ids[t.prompt_length:])): t
              for out in trainer.rollouts for t in out["trajectory"]}
    policy_grads = 0
    for rec in trainer.losses:
        x = rec["inputs"]
        completion_mask = x["completion_mask"]
        mask = completion_mask * x["tool_mask"]            # what TRL multiplies the per-token loss with
        width = x["prompt_ids"].shape[1]
        logps_grad, hidden_grad = rec["logps"].grad, rec["hidden"].grad
        assert logps_grad is not None and hidden_grad is not None
        for b in range(mask.shape[0]):
            n = int(completion_mask[b].sum())
            prompt = tuple(x["prompt_ids"][b][x["prompt_mask"][b].bool()].tolist())
            traj = by_ids[(prompt, tuple(x["completion_ids"][b, :n].tolist()))]
            expected = traj.loss_mask[traj.prompt_length:] + [0] * (mask.shape[1] - n)
            assert mask[b].tolist() == expected                  # 0 on env tokens (and padding), 1 on sampled ids
            assert 0 in expected[:n] and expected[0] == 1        # env tokens sit between policy turns
            # gradient of the loss w.r.t. each completion token's log-prob, and w.r.t. the hidden state
            # that produces that token's logits (position width + j - 1 predicts completion token j)
            for j in range(mask.shape[1]):
                g_hidden = hidden_grad[b, width + j - 1]
                if mask[b, j] == 0:
                    assert logps_grad[b, j] == 0 and torch.all(g_hidden == 0), (b, j)
                elif x["advantages"][b] != 0:
                    assert logps_grad[b, j] != 0 and g_hidden.abs().sum() > 0, (b, j)
                    policy_grads += 1
    assert policy_grads > 0


def test_rollout_func_output_is_the_episode_token_for_token(run):
    trainer, tok = run["trainer"], cached_tokenizer()
    prompts = [p for p in trainer.train_dataset["prompt"][:2] for _ in range(2)]   # as TRL's sampler repeats them
    out = trainer.rollout_func(prompts, trainer)
    trajs = out["trajectory"]
    assert all(len(out[k]) == 4 for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward"))
    rows = dict(zip(map(prompt_key, trainer.train_dataset["prompt"]), trainer.train_dataset["task_index"]))
    for i, t in enumerate(trajs):
        p, c = out["prompt_ids"][i], out["completion_ids"][i]
        assert p + c == t.token_ids and len(p) == t.prompt_length
        assert len(c) == len(out["logprobs"][i]) == len(out["env_mask"][i])
        assert out["env_mask"][i] == t.loss_mask[t.prompt_length:]
        assert out["logprobs"][i] == t.logprobs[t.prompt_length:]
        assert all(lp == 0.0 for lp, m in zip(out["logprobs"][i], out["env_mask"][i]) if m == 0)
        assert out["env_task_index"][i] == t.task_index == rows[prompt_key(prompts[i])]
        assert out["env_reward"][i] == t.total_reward
        assert_faithful(t, tok, "chat")       # the ids decode to exactly the rendered episode
        # read from the rollout output alone: the env_mask=1 runs decode to the actions the env received,
        # the env_mask=0 runs hold the observations, in order
        runs, start = [], 0
        for j in range(1, len(c) + 1):
            if j == len(c) or out["env_mask"][i][j] != out["env_mask"][i][start]:
                runs.append((out["env_mask"][i][start], c[start:j]))
                start = j
        assert [tok.decode(ids, skip_special_tokens=True) for m, ids in runs if m == 1] == t.actions
        env_text = "".join(tok.decode(ids, skip_special_tokens=False) for m, ids in runs if m == 0)
        observations = [m["content"] for m in t.messages[len(prompts[i]):] if m["role"] != "assistant"]
        assert observations and len(runs) == 2 * len(t.actions) - 1
        pos = 0
        for content in observations:
            pos = env_text.index(content, pos) + len(content)
    assert episode_reward([None] * 4, trajectory=trajs, task_index=[rows[prompt_key(p)] for p in prompts],
                          env_task_index=out["env_task_index"]) == out["env_reward"]
    with pytest.raises(AssertionError, match="other tasks"):
        episode_reward([None] * 4, trajectory=trajs, task_index=[-1] * 4, env_task_index=out["env_task_index"])

    # TRL's own recomputation of the log-probs (padded as TRL pads, fused LM head, its temperature)
    # equals the sampling log-probs on every policy token
    pad = tok.pad_token_id
    P, C = max(map(len, out["prompt_ids"])), max(map(len, out["completion_ids"]))
    ids = torch.tensor([[pad] * (P - len(p)) + p + c + [pad] * (C - len(c))
                        for p, c in zip(out["prompt_ids"], out["completion_ids"])])
    attn = torch.tensor([[0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (C - len(c))
                         for p, c in zip(out["prompt_ids"], out["completion_ids"])])
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, C)
    assert trainer.temperature == TEMPERATURE
    for i, (sampled, m) in enumerate(zip(out["logprobs"], out["env_mask"])):
        on_policy = [j for j, k in enumerate(m) if k]
        torch.testing.assert_close(logps[i, on_policy], torch.tensor([sampled[j] for j in on_policy]),
                                   atol=2e-4, rtol=0)
