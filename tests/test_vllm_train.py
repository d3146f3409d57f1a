"""``agentgym train backend=vllm`` end to end with the real vLLM CPU engine: the engine samples, the
learner trains a transformers copy, weights are synced in place after every update, old log-probs are
recomputed by the learner and the sampler-vs-learner divergence is logged. Skipped only when vLLM
cannot be imported (CI installs it: ``bash scripts/setup.sh --vllm``)."""

from __future__ import annotations

import csv
import importlib.util

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vllm not installed: bash scripts/setup.sh --vllm")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A 2-layer random Llama with head_dim 32 (vLLM's CPU attention needs a multiple of 32) and the real
    SmolLM2 tokenizer, saved as a plain model directory: a model spec like any other."""
    from agentgym.policies.models import load_tokenizer, tiny_random_model
    tok = load_tokenizer()
    d = tmp_path_factory.mktemp("tiny32")
    tiny_random_model(tok, hidden=64, heads=2, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_train_with_the_vllm_backend(model_dir, tmp_path):
    from agentgym.app.cli import main
    out = tmp_path / "run"
    assert main(["--threads", "1", "train", f"model={model_dir}", "backend=vllm", "steps=2", "groups_per_step=2",
                 "group_size=2", "sampling.max_new_tokens=6", "sampling.temperature=0.8", "optim.lr=1e-3",
                 "eval.episodes=2", "tensorboard=false", f"output_dir={out}"]) == 0
    rows = list(csv.DictReader((out / "train_log.csv").open()))
    assert len(rows) == 2
    for r in rows:
        assert float(r["time/sync_s"]) > 0                        # weights pushed into the engine every step
        assert float(r["train/temperature"]) == pytest.approx(0.8)
        # fp32 engine and fp32 learner on the same weights: the sampler's log-probs agree closely
        assert float(r["train/sampler_logp_diff_mean"]) < 1e-3
        assert float(r["train/ratio_mean"]) == pytest.approx(1.0, abs=1e-3)
