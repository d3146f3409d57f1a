"""Progress that moves while a batched generate call runs: the hf policy reports after every decode step,
the rollout engine passes it on to progress callbacks that ask for it (eval bars), ids unchanged."""

from __future__ import annotations

import torch
from fixtures_llm import one_torch_thread  # noqa: F401  (autouse: one torch thread)

from agentgym.policies.transformers_policy import TransformersPolicy
from agentgym.policy import SamplingParams
from agentgym.rollout_config import RolloutConfig
from agentgym.rollout import RolloutEngine


def test_hf_generate_reports_every_decode_step_and_generates_the_same_ids():
    policy = TransformersPolicy.tiny_random(seed=0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    sp = SamplingParams(max_new_tokens=5, temperature=1.0, seed=3)
    reports: list[tuple[int, int]] = []
    with_progress = policy.generate(prompts, sp, on_progress=lambda done, tokens: reports.append((done, tokens)))
    plain = policy.generate(prompts, sp)
    assert [g.token_ids for g in with_progress] == [g.token_ids for g in plain]   # observing changes nothing
    assert len(reports) >= 4                                   # one per decode step (the last may end early)
    assert [d for d, _ in reports] == sorted(d for d, _ in reports) and reports[-1][0] <= len(prompts)
    assert [t for _, t in reports] == sorted(t for _, t in reports)
    assert reports[-1][1] == sum(len(g.token_ids) for g in plain)


def test_hf_generate_counts_stopped_rows_as_done_and_splits_batches():
    policy = TransformersPolicy.tiny_random(seed=0)
    policy.max_batch_size = 2
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    first = policy.generate(prompts, greedy)
    stop = policy.tokenizer.decode(first[0].token_ids[:2])   # row 0 completes it by its 2nd token
    sp = greedy.replace(stop=[stop])
    expected = policy.generate(prompts, sp)
    reports: list[tuple[int, int]] = []
    got = policy.generate(prompts, sp, on_progress=lambda done, tokens: reports.append((done, tokens)))
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    ended = [i for i, g in enumerate(expected) if g.finish_reason in ("stop", "eos")]
    assert 0 in ended and len(expected[0].token_ids) < 6     # row 0 ends early (stop string, or eos first)
    assert any(done >= 1 for done, _ in reports[:-1])         # ... and was counted while the others ran
    assert reports[-1][1] == sum(len(g.token_ids) for g in expected)   # both batches' tokens, in order


def test_eval_progress_callbacks_see_the_call_in_flight():
    policy = TransformersPolicy.tiny_random(seed=0)
    seen: list[tuple[int, int, tuple[int, int] | None]] = []
    engine = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_new_tokens=4, greedy=True)))
    try:
        engine.collect("Arithmetic-v0", num_groups=3, group_size=1, seed=0,
                       progress=lambda p: seen.append((p.finished, p.tokens, p.generating)))
    finally:
        engine.close()
    live = [g for _, _, g in seen if g is not None]
    assert live and all(n == 3 for _, n in live)               # per decode step, for the 3 sequences
    assert seen[-1][0] == 3                                     # episodes
    assert torch.get_num_threads() == 1
