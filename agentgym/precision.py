"""One precision knob: ``precision: auto | fp32 | bf16``.

``bf16`` runs the matmuls under ``torch.autocast(..., dtype=torch.bfloat16)``; master weights,
optimizer state, log-softmax and the loss stay fp32 (autocast keeps reductions such as
``log_softmax`` in fp32), as on CUDA. ``fp32`` runs everything in fp32. ``auto`` is bf16 on CUDA,
and on a CPU whatever a short measurement says is faster: bf16 autocast was 1.7× faster than fp32
for SmolLM2's fwd+bwd on an AMD EPYC with ``avx512_bf16`` and 2.4× on a Xeon with AMX, but a CPU
without bf16 units emulates it and is *slower* — so the choice is measured, not assumed
(:func:`probe_cpu_bf16`: a fwd+bwd of a transformer-MLP-sized block at a training shape, fp32 and
bf16 interleaved, best of a few, well under a second). The result is cached per machine under
``$AGENTGYM_CACHE`` (default ``~/.cache/agentgym``), keyed by the CPU model, its bf16-related flags
and the torch version, so each run pays for the probe at most once per machine — if the machine was quiet
when it measured (a probe on a busy machine measures the other work; it decides that run and is not kept). The choice and its
evidence go into the run's provenance (:meth:`Precision.to_dict`). ``AGENTGYM_PRECISION=fp32|bf16`` tells
``auto`` this CPU's answer instead of measuring it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PRECISIONS", "Precision", "resolve_precision", "probe_cpu_bf16", "check_precision", "cpu_identity",
           "learner_precision"]

PRECISIONS = ("auto", "fp32", "bf16")
#: set to fp32 or bf16, what ``auto`` resolves to on a CPU without probing: numerics that do not depend on
#: the CPU kind (the test suite sets fp32, so the same assertions hold on a Xeon with AMX and an EPYC)
ENV_OVERRIDE = "AGENTGYM_PRECISION"
#: bf16 must beat fp32 by this factor for ``auto`` to pick it (the probe's run-to-run noise is ~5 %)
MIN_SPEEDUP = 1.15
_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2")


def check_precision(value: str) -> str:
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


@dataclass(frozen=True)
class Precision:
    """A resolved precision: ``name`` is ``fp32`` or ``bf16``; ``setting`` what was asked for."""

    name: str
    device_type: str = "cpu"
    setting: str = "fp32"
    reason: str = "asked for"
    probe: dict[str, Any] = field(default_factory=dict)

    @property
    def bf16(self) -> bool:
        return self.name == "bf16"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the model's forward passes run in (a no-op for fp32)."""
        if not self.bf16:
            return contextlib.nullcontext()
        import torch
        return torch.autocast(self.device_type, dtype=torch.bfloat16)

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "resolved": self.name, "device": self.device_type, "reason": self.reason,
                **({"probe": self.probe} if self.probe else {})}

    def describe(self) -> str:
        p = self.probe
        figures = (f"; probe: fp32 {p['fp32_ms']:.0f} ms, bf16 {p['bf16_ms']:.0f} ms, {p['speedup']:.2f}x"
                   f"{' (cached)' if p.get('cached') else ''}") if p else ""
        return f"precision {self.name} ({self.setting}: {self.reason}{figures})"


def cpu_identity() -> dict[str, Any]:
    """What the probe result depends on: the CPU model, its bf16-related flags, the torch version."""
    import torch
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        import platform
        model = platform.processor() or "unknown"
    return {"cpu": model, "flags": sorted(f for f in _CPU_FLAGS if f in flags), "torch": torch.__version__}


def _cache_path() -> Path:
    return Path(os.environ.get("AGENTGYM_CACHE", Path.home() / ".cache" / "agentgym")) / "precision_probe.json"


def probe_cpu_bf16(*, tokens: int = 512, hidden: int = 576, inner: int = 1536, repeats: int = 3) -> dict[str, Any]:
    """Time fwd+bwd of a gated MLP block (SmolLM2-135M's sizes) on ``tokens`` rows in fp32 and under bf16
    autocast, interleaved so that a load change hits both; best of ``repeats`` each, in the current torch
    thread count. Returns the milliseconds and the speed-up (fp32 time / bf16 time).

    A screening pass on an eighth of the rows comes first: where bf16 is emulated it is many times slower
    (25x measured on an AMD EPYC without avx512_bf16), the verdict is plain, and the full-size bf16 passes
    would cost seconds — so the screen's figures are the answer there."""
    import torch
    gen = torch.Generator().manual_seed(0)
    x_full = torch.randn(tokens, hidden, generator=gen)
    w = [(torch.randn(*shape, generator=gen) * 0.02).requires_grad_()
         for shape in ((hidden, inner), (hidden, inner), (inner, hidden))]

    def step(x: Any, bf16: bool) -> float:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        t0 = time.perf_counter()
        with ctx:
            h = torch.nn.functional.silu(x @ w[0]) * (x @ w[1])
            out = (h @ w[2]).float().square().mean()
        out.backward()
        for t in w:
            t.grad = None
        return time.perf_counter() - t0

    def timed(x: Any, n: int) -> tuple[float, float]:
        fp32, bf16 = [], []
        for _ in range(n):
            fp32.append(step(x, False))
            bf16.append(step(x, True))
        return min(fp32), min(bf16)

    small = x_full[: max(1, tokens // 8)]
    step(small, False), step(small, True)        # warm-up: oneDNN picks (and may JIT) its kernels once
    f, b = timed(small, 1)
    rows, screened = len(small), True
    if b < 2 * f:                                # not plainly slower: measure at the full shape
        step(x_full, False), step(x_full, True)
        f, b = timed(x_full, repeats)
        rows, screened = tokens, False
    return {"fp32_ms": 1e3 * f, "bf16_ms": 1e3 * b, "speedup": f / b, "threads": torch.get_num_threads(),
            "shape": [rows, hidden, inner], "screened_out": screened}


def _machine_busy() -> tuple[float, int, bool]:
    """(1-minute load average, usable CPUs, whether other work competes for them). A probe taken while
    other processes hold the cores measures them, not the CPU: one cached on a Xeon with AMX under a
    load of ~8 said bf16 was 0.89x fp32, where a quiet probe says 2.1-2.4x (2026-11-28)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 0.0, 1, False
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return load, cpus, load > cpus - 0.5


def _cached_probe(refresh: bool = False) -> dict[str, Any]:
    """The probe's verdict for this machine: from the cache when a quiet probe is cached, else measured.
    A probe taken on a busy machine decides this run only and is not cached (the next run measures again);
    cached entries without a quiet-probe record (older versions) are measured again."""
    ident = cpu_identity()
    key = json.dumps(ident, sort_keys=True)
    path = _cache_path()
    cache: dict[str, Any] = {}
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(key)
    if not refresh and isinstance(entry, dict) and entry.get("quiet") is True:
        return {**entry, "cached": True}
    load, cpus, busy = _machine_busy()
    result = {**probe_cpu_bf16(repeats=7 if busy else 3), **ident, "load": round(load, 2), "quiet": not busy}
    if busy:
        return {**result, "cached": False}
    cache[key] = result
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    except OSError:
        pass                                     # a read-only cache only costs the probe next time
    return {**result, "cached": False}


def resolve_precision(setting: str, device: Any = "cpu", *, refresh_probe: bool = False) -> Precision:
    """``auto`` / ``fp32`` / ``bf16`` on ``device`` → the :class:`Precision` to run with."""
    check_precision(setting)
    device_type = getattr(device, "type", None) or str(device or "cpu").split(":")[0]
    if setting != "auto":
        return Precision(setting, device_type, setting)
    if device_type == "cuda":
        return Precision("bf16", device_type, setting, "CUDA")
    if device_type != "cpu":
        return Precision("fp32", device_type, setting, f"no probe for {device_type}")
    forced = os.environ.get(ENV_OVERRIDE, "").strip()
    if forced:   # this machine's answer, given instead of measured (reproducible numerics across CPU kinds)
        if forced not in ("fp32", "bf16"):
            raise ValueError(f"{ENV_OVERRIDE} must be fp32 or bf16 (what auto means on this CPU), got {forced!r}")
        return Precision(forced, device_type, setting, f"{ENV_OVERRIDE}={forced}")
    probe = _cached_probe(refresh_probe)
    faster = probe["speedup"] >= MIN_SPEEDUP
    reason = (f"bf16 measured {probe['speedup']:.2f}x fp32 on this CPU" if faster else
              f"bf16 not faster here ({probe['speedup']:.2f}x fp32; needs >= {MIN_SPEEDUP}x)")
    return Precision("bf16" if faster else "fp32", device_type, setting, reason, probe)


def learner_precision(precision: Any, device: Any) -> Precision:
    """A :class:`~agentgym.precision.Precision` from ``precision`` (one, or ``auto`` / ``fp32`` / ``bf16``);
    None = the library default: bf16 autocast on CUDA, fp32 elsewhere (no probe, so direct library use and
    the numeric parity tests stay fp32 on every CPU)."""
    if isinstance(precision, Precision):
        return precision
    if precision is None:
        return Precision("bf16" if device.type == "cuda" else "fp32", device.type, "default", "library default")
    return resolve_precision(str(precision), device)
