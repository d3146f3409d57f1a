"""TRL's ``GRPOTrainer(environment_factory=...)`` on ``agentgym serve``, through the factory class that
docs/protocols.md shows ("Serve an env to TRL"): the class is taken from the page, not copied, so the
docs and this test cannot drift apart.

A real trainer (a tiny random Llama, the SmolLM2 tokenizer with TRL's own Qwen2.5 chat template, which
renders tool calls as TRL requires) trains one step on the CPU against a real server subprocess. TRL
itself builds the environments, calls ``reset(**row)``, puts the returned task text into the prompts,
and scores the rollouts with ``get_reward``. A random model does not call tools, so the tool ``act`` is
then called through the tool table TRL built for that batch, as its tool loop would call it.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
trl = pytest.importorskip("trl")

from fixtures_llm import one_torch_thread  # noqa: E402,F401 (autouse fixture)
from test_docs import page_blocks  # noqa: E402

import agentgym  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocols.md"
TASK = 3


def factory_class() -> type:
    """``AgentgymOpenEnv`` as docs/protocols.md defines it (the one block that does)."""
    blocks = [b for b in page_blocks(DOC)[0] if b.lang == "python" and "class AgentgymOpenEnv" in b.code]
    assert len(blocks) == 1, "docs/protocols.md should define AgentgymOpenEnv in exactly one block"
    namespace: dict = {"__name__": "docs_protocols"}
    exec(compile(blocks[0].code, str(DOC), "exec"), namespace)
    return namespace["AgentgymOpenEnv"]


@pytest.fixture(scope="module")
def server_url():
    proc = subprocess.Popen([sys.executable, "-m", "agentgym", "serve", "Arithmetic-v0", "--port", "0",
                             "--max-sessions", "4", "max_turns=3"], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    m = re.search(r"http://[\d.]+:\d+", proc.stdout.readline() if ready else "")
    assert m, f"agentgym serve did not print its URL (exit code {proc.poll()})"
    yield m.group(0)
    proc.terminate()
    proc.wait(30)


def _trainer(url: str, tmp_path: Path):
    from datasets import Dataset
    from trl.chat_template_utils import qwen2_5_chat_template

    from agentgym.policies.models import load_tokenizer, tiny_random_model
    tok = load_tokenizer()  # its own copy: the suite's shared tokenizer keeps SmolLM2's template
    tok.chat_template = qwen2_5_chat_template
    model = tiny_random_model(tok, seed=0)
    args = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=1, num_generations=2, per_device_train_batch_size=2,
                          max_completion_length=8, learning_rate=1e-3, beta=0.0, logging_steps=1,
                          save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0)
    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * 2, "task_index": [TASK] * 2})
    return trl.GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=rows,
                           environment_factory=partial(factory_class(), url))


def test_grpo_trainer_runs_the_docs_factory_against_agentgym_serve(server_url, tmp_path):
    trainer = _trainer(server_url, tmp_path)
    assert [t.__name__ for t in trainer.tools] == ["act"]            # the one public method, as a tool
    assert trainer.reward_func_names == ["AgentgymOpenEnv"]         # get_reward is the reward source
    question = agentgym.make("Arithmetic-v0").reset(options={"task_index": TASK})[0][-1]["content"]
    trainer.train()
    envs = trainer.environments
    assert len(envs) == 2 and len({id(e) for e in envs}) == 2      # one session per rollout of the batch
    prompts = list(trainer._logs["prompt"])                        # what the model was prompted with
    assert len(prompts) == 2 and all(question in str(p) for p in prompts)  # reset's text, from the server
    assert trainer.state.log_history[0]["rewards/AgentgymOpenEnv/mean"] == 0.0  # no tool call: no score
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "7 - 10"}}</tool_call>'
    assert question == "What is 7 - 10?"
    for env, tools in zip(envs, trainer._sync_tool_dicts):         # the tool table TRL built for the batch
        assert env._client.state()["step_count"] == 0
        assert tools["act"](message=call) == "-3"
        assert tools["act"](message="<answer>-3</answer>") == ""
        with pytest.raises(RuntimeError, match="over"):              # TRL turns this into an error result
            tools["act"](message="again")
    rewards = trainer.reward_funcs[-1](environments=envs)          # what TRL's reward step calls
    assert rewards == [pytest.approx(1.05)] * 2
    for env in envs:
        env._client.close()
