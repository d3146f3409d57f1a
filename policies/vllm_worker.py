"""Code that runs inside vLLM's worker, where the model lives: :class:`VLLMWorkerExtension`.

vLLM mixes this class into its worker (``worker_extension_cls="agentgym.policies.vllm_worker.
VLLMWorkerExtension"``) and we call its methods by name through ``LLM.collective_rpc``. The worker is
this process for the in-process engine, or vLLM's engine process otherwise, which imports this module
by that name: so it is its own small module, importing nothing from vLLM or the rest of agentgym,
and the patches below are closures installed on the worker's own objects (nothing is pickled).
"""

from __future__ import annotations

from typing import Any

__all__ = ["VLLMWorkerExtension"]


class VLLMWorkerExtension:
    """Methods mixed into vLLM's worker (``worker_extension_cls``): they run where the model lives,
    in-process or in the engine's worker process, and are called by name through ``collective_rpc``."""

    def agentgym_patch_sampler(self) -> dict[str, bool]:
        """Two fixes to the sampler, installed once per worker; returns which ones took.

        ``prefilter_logprobs``: report log-softmax(logits / T) *before* the top-k / top-p filter.
        vLLM's ``processed_logprobs`` are taken after it (renormalised over the kept tokens). The
        top-k / top-p sampler receives logits already divided by T, so we take the log-softmax of its
        input and let it sample as before.

        ``cpu_seed_rewind``: with per-request seeds and a prompt prefilled in chunks, vLLM discards
        the token sampled after a partial prefill and rewinds that request's generator with
        ``set_offset``, which CPU generators do not have ("CPU Generator does not use offset": every
        seeded batch whose prompts exceed one step's token budget crashed). We snapshot each CPU
        generator's state before the draw and restore it for the discarded rows instead, so a seeded
        request's tokens do not depend on how its prompt was chunked or batched.
        """
        done = {"prefilter_logprobs": False, "cpu_seed_rewind": False}
        runner = getattr(self, "model_runner", None)
        tk = getattr(getattr(runner, "sampler", None), "topk_topp_sampler", None)
        if tk is None or not hasattr(tk, "logprobs_mode"):
            return done
        if getattr(tk, "_agentgym_patched", None) is not None:
            return tk._agentgym_patched
        before_draw: dict[int, Any] = {}  # row -> CPU generator state before this step's draw
        _patch_prefilter_logprobs(tk, before_draw)
        done["prefilter_logprobs"] = True
        done["cpu_seed_rewind"] = _patch_cpu_seed_rewind(runner, before_draw)
        tk._agentgym_patched = done
        return done

    def agentgym_reload_weights_from_file(self, path: str) -> None:
        """Worker-side weight sync for the multiprocess engine (tensors cannot cross collective_rpc)."""
        from safetensors.torch import load_file
        self.reload_weights(weights_iterator=list(load_file(path).items()))  # type: ignore[attr-defined]


def _patch_prefilter_logprobs(tk: Any, before_draw: dict[int, Any]) -> None:
    """Wrap the top-k / top-p sampler's ``forward``: return log-softmax of its input (logits / T) when
    a filter is on, and snapshot every CPU generator's state into ``before_draw`` before it draws."""
    import torch
    inner = tk.forward

    def forward(logits: torch.Tensor, generators: Any, k: Any, p: Any) -> tuple[torch.Tensor, Any]:
        before_draw.clear()
        before_draw.update({i: g.get_state() for i, g in generators.items() if g.device.type == "cpu"})
        if k is None and p is None:  # nothing filtered: vLLM's own processed log-probs are ours
            return inner(logits, generators, k, p)
        pre = logits.log_softmax(dim=-1, dtype=torch.float32)  # before the filter edits logits in place
        mode, tk.logprobs_mode = tk.logprobs_mode, "raw_logprobs"  # skip vLLM's renormalised ones
        try:
            sampled, _ = inner(logits, generators, k, p)
        finally:
            tk.logprobs_mode = mode
        return sampled, pre

    tk.forward = forward


def _patch_cpu_seed_rewind(runner: Any, before_draw: dict[int, Any]) -> bool:
    """Wrap the runner's ``_bookkeeping_sync``: for each discarded row with a CPU generator, restore
    the state from before this step's draw and hide the generator from vLLM's ``set_offset``.
    False when this vLLM build has no such hook (nothing to fix there)."""
    import numpy as np
    bookkeeping = getattr(runner, "_bookkeeping_sync", None)
    if bookkeeping is None or not hasattr(runner, "discard_request_mask") or not hasattr(runner, "input_batch"):
        return False

    def bookkeeping_sync(*args: Any, **kwargs: Any) -> Any:
        batch = runner.input_batch
        hidden = {}
        for i in np.nonzero(runner.discard_request_mask.np[:batch.num_reqs])[0].tolist():
            gen = batch.generators.get(i)
            if gen is not None and gen.device.type == "cpu":
                if i in before_draw:  # undo this step's draw; no draw this step: nothing to undo
                    gen.set_state(before_draw[i])
                hidden[i] = batch.generators.pop(i)  # keep vLLM's set_offset away from it
        try:
            return bookkeeping(*args, **kwargs)
        finally:
            batch.generators.update(hidden)
            before_draw.clear()

    runner._bookkeeping_sync = bookkeeping_sync
    return True
