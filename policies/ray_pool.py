"""N generation engines as Ray actors, data-parallel over episodes: ``RayPolicyPool``.

Each actor loads the same model spec with the one loader (``load_policy(spec, backend)``: transformers
or vLLM). ``generate`` splits a batch of prompts into contiguous shares, one per actor, and returns the
generations in order, so the rollout engine sees one policy.

Weight pushes. After every optimizer step the trainer calls :meth:`RayPolicyPool.sync_weights`; every
actor then loads the new weights with its policy's own ``sync_weights`` (in place; vLLM also resets its
prefix cache). Two transports move the tensors there (``weight_transfer=``):

* ``"object_store"``: the state dict is put once in Ray's object store and every actor fetches it.
* ``"collective"``: a torch.distributed process group of its own — the trainer is rank 0, the actors
  ranks 1..N, rendezvous through a ``TCPStore`` the pool opens on the driver's Ray node IP (a free
  port) — built directly as ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` objects, never with
  ``init_process_group``: the trainer may already be inside torchrun's default group, and the weight
  group must not touch it. One Ray call per actor carries the tensors' layout (names, shapes, dtypes,
  byte offsets) and starts its receive; the trainer then broadcasts the weights packed into a few
  byte buckets (``weight_bucket_mb``; tied tensors such as a tied LM head travel once), the actors
  unpack views of those buckets and hand ``(name, tensor)`` pairs to their policy. The backend is
  NCCL when the trainer's weights are on a GPU and every actor has a GPU of its own (not the
  trainer's, not another actor's: NCCL refuses two ranks on one device), else gloo over TCP. It is the
  same code on both: the CPU path that the tests run for real is the GPU path with another backend.
* ``"auto"`` (default): ``"collective"`` everywhere, because even the CPU path was faster: pushing
  SmolLM2-135M fp32 (513 MB on the wire) to 2 actors on the 2-core dev machine (loaded, load average
  3.6–4.3) took 1.38 s by gloo against 2.16 s through the object store (median of 3, interleaved;
  ``benchmarks/scale_out.py --sections weight_push``; an earlier run: 1.35 / 2.21 s); one broadcast per tensor
  (273) instead of 3 packed buckets took 1.51 s. On GPUs NCCL also skips the device→host→store→host→device copies.

The group is opened at the first collective push (its backend depends on where the weights are) and
reused by later ones; :meth:`close` tears it down on both sides, and a garbage-collected pool shuts
its (trainer's) side down through a finalizer while Ray ends the actors. An actor receives every bucket
before it loads them, so a load error (wrong names or shapes) is raised after the collective and
leaves no rank blocked in it; an actor that dies or cannot reach the store fails the set-up with an
error naming its rank, within ``weight_sync_timeout_s``.

Seeds: with ``SamplingParams.seed = s``, actor ``i`` samples its share with seed ``s + 1_000_003·i`` so the pool
is reproducible for a fixed number of workers (sampled ids differ from one engine's, as between any two engines).
"""

from __future__ import annotations

import os
import time
import weakref
from datetime import timedelta
from typing import Any, Mapping, Sequence

from agentgym.backend import TokenBackend
from agentgym.policies.backends import check_weight_transfer
from agentgym.policy import Generation, SamplingParams

__all__ = ["RayPolicyPool", "collective_backend", "plan_buckets",
           "tensor_digest"]

_READY = "agentgym/weights-ready"   # store key prefix: an actor has reached the store
_ALIGN = 64                     # byte offset of every tensor in a bucket: any dtype can view it


def collective_backend(trainer_gpu: str | None, worker_gpus: Sequence[str | None]) -> str:
    """``"nccl"`` when the trainer's weights are on a GPU (its UUID) and every worker has a GPU that is
    neither the trainer's nor another worker's, else ``"gloo"`` (NCCL cannot put two ranks on one GPU)."""
    if trainer_gpu is None or any(g is None for g in worker_gpus):
        return "gloo"
    if len({trainer_gpu, *worker_gpus}) != len(worker_gpus) + 1:
        return "gloo"
    return "nccl"


# ------------------------------------------------------------------ packing (pure, both sides)

def plan_buckets(named: Sequence[tuple[str, Any]], bucket_bytes: int) -> tuple[list[tuple], list[int]]:
    """The wire layout of ``(name, tensor)`` pairs: ``(entries, bucket_sizes)`` where an entry is
    ``(name, shape, dtype, bucket, offset, alias)``. Tensors go in order into byte buckets of at most
    ``bucket_bytes`` (a bigger tensor gets a bucket of its own), each at a 64-byte aligned offset; a
    tensor that is a view of an earlier one with the same shape (tied weights) is sent once: its entry
    has ``alias`` = that entry's index (else -1)."""
    entries: list[tuple] = []
    sizes: list[int] = []
    seen: dict[tuple, int] = {}
    for name, t in named:
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.numel() else None
        if key is not None and key in seen:
            entries.append((name, tuple(t.shape), t.dtype, -1, 0, seen[key]))
            continue
        nbytes = t.numel() * t.element_size()
        if not sizes or (nbytes and sizes[-1] and sizes[-1] + nbytes > bucket_bytes):
            sizes.append(0)
        offset = sizes[-1]
        sizes[-1] = offset + (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        if key is not None:
            seen[key] = len(entries)
        entries.append((name, tuple(t.shape), t.dtype, len(sizes) - 1, offset, -1))
    return entries, sizes


def _pack(named: Sequence[tuple[str, Any]], entries: Sequence[tuple], bucket: int, size: int, device: Any) -> Any:
    import torch
    buf = torch.empty(size, dtype=torch.uint8, device=device)
    for (_, t), (_, _, _, b, offset, alias) in zip(named, entries):
        if b == bucket and alias < 0:
            n = t.numel() * t.element_size()
            if n:
                buf[offset:offset + n].copy_(t.detach().reshape(-1).view(torch.uint8))
    return buf


def _unpack(buffers: Sequence[Any], entries: Sequence[tuple]) -> list[tuple[str, Any]]:
    """Views into the received buckets (no copy), in the sender's order."""
    import math

    import torch
    out: list[tuple[str, Any]] = []
    for name, shape, dtype, b, offset, alias in entries:
        if alias >= 0:
            out.append((name, out[alias][1]))
            continue
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        out.append((name, buffers[b][offset:offset + n].view(dtype).view(shape)))
    return out


# ------------------------------------------------------------------ one side of the weight group

class _WeightGroup:
    """A standalone process group for weight pushes (rank 0: the trainer). Not the default group."""

    def __init__(self, backend: str, store: Any, rank: int, world_size: int, timeout_s: float,
                 host: str, device: Any):
        import torch
        import torch.distributed as dist
        self.backend, self.rank, self.device = backend, rank, device
        self.store = store
        self.timeout = timeout = timedelta(seconds=timeout_s)
        prefixed = dist.PrefixStore("agentgym/weights", store)
        if backend == "nccl":
            if not dist.is_nccl_available():
                raise RuntimeError("this torch build has no NCCL")
            torch.cuda.set_device(device)
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = False
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
        elif backend == "gloo":
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, opts)
        else:
            raise ValueError(f"unknown collective backend {backend!r}")
        # the first collective: NCCL builds its communicator here, and both check that every rank is in
        probe = torch.full((1,), 7 if rank == 0 else 0, dtype=torch.int32, device=device)
        self.broadcast(probe)
        if int(probe.item()) != 7:
            raise RuntimeError("weight group probe broadcast returned the wrong value")

    def broadcast(self, tensor: Any) -> None:
        import torch.distributed as dist
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([tensor], opts).wait(self.timeout)    # with a timeout: NCCL blocks this thread too

    def shutdown(self) -> None:
        pg, self.pg, self.store = self.pg, None, None
        if pg is None:
            return
        for how in ("shutdown", "abort"):
            fn = getattr(pg, how, None)
            if fn is not None:
                try:
                    fn()
                    return
                except Exception:
                    continue


def tensor_digest(t: Any) -> str:
    """SHA-256 of a tensor's bytes (on CPU): equal digests = bit-identical weights."""
    import hashlib

    import torch
    return hashlib.sha256(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _gpu_uuid(device: Any) -> str | None:
    import torch
    if device is None or torch.device(device).type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(torch.device(device)).uuid)


# ------------------------------------------------------------------ the actor

class _PolicyHost:
    def __init__(self, spec: str, backend: str, seed: int, options: Mapping[str, Any], threads: int,
                 dtype: Any = None):
        import torch

        from agentgym.policies.loading import load_policy
        torch.set_num_threads(threads)
        self.policy = load_policy(spec, backend, seed=seed, dtype=dtype, **dict(options))
        self._group: _WeightGroup | None = None

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        return self.policy.generate(prompts, sampling)

    def sync_weights(self, weights: Any) -> float:
        if isinstance(weights, Mapping):
            weights = list(weights.items())
        return float(self.policy.sync_weights(weights) or 0.0)

    def gpu(self) -> str | None:
        """This actor's GPU (UUID) when it has one (Ray sets ``CUDA_VISIBLE_DEVICES``), else None."""
        import torch
        return _gpu_uuid(torch.device("cuda", torch.cuda.current_device())) if torch.cuda.is_available() else None

    def join_weight_group(self, backend: str, host: str, port: int, rank: int, world_size: int,
                          timeout_s: float) -> str:
        import ray
        import torch
        import torch.distributed as dist
        self.leave_weight_group()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
        store.set(f"{_READY}/{rank}", "1")
        self._group = _WeightGroup(backend, store, rank, world_size, timeout_s,
                                   ray.util.get_node_ip_address(), device)
        return backend

    def receive_weights(self, entries: Sequence[tuple], sizes: Sequence[int]) -> float:
        """Take part in one push: receive every bucket, then load (errors only after the collective)."""
        import torch
        g = self._group
        if g is None:
            raise RuntimeError("receive_weights before join_weight_group")
        buffers = [torch.empty(n, dtype=torch.uint8, device=g.device) for n in sizes]
        for buf in buffers:
            g.broadcast(buf)
        return self.sync_weights(_unpack(buffers, entries))

    def leave_weight_group(self) -> None:
        if self._group is not None:
            self._group.shutdown()
            self._group = None

    def weight_dtypes(self) -> list[str]:   # the dtypes of the policy's module's tensors (``policy.model``)
        return sorted({str(v.dtype) for v in self.policy.model.state_dict().values()})

    def state_digest(self) -> dict[str, str]:
        """SHA-256 of every tensor of the policy's module (``policy.model``): for exact weight checks."""
        return {k: tensor_digest(v) for k, v in self.policy.model.state_dict().items()}

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.leave_weight_group()
        self.policy.close()   # a Backend (the one loader's product): close is part of its interface


# ------------------------------------------------------------------ the pool (driver / trainer side)

class _TrainerSide:
    """The trainer's end of the weight group. Holds no reference to the pool, so a finalizer can
    release it when the pool is garbage-collected (Ray ends the actors once their handles are gone)."""

    def __init__(self) -> None:
        self.group: _WeightGroup | None = None

    def release(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.shutdown()


def _wait_until_ready(store: Any, joined: Sequence[Any], timeout_s: float) -> tuple[int, BaseException] | None:
    """Wait until every actor has written its ready key (``join_weight_group``), or one of their join
    calls has ended (it can only end early by failing), or ``timeout_s``: ``(rank, error)`` or None."""
    import ray
    keys = [f"{_READY}/{rank}" for rank in range(1, len(joined) + 1)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        done, _ = ray.wait(list(joined), num_returns=1, timeout=0.05)
        if done:
            rank = list(joined).index(done[0]) + 1
            try:
                ray.get(done[0])
            except Exception as e:  # died, unreachable store, no NCCL, ...
                return rank, e
            return rank, RuntimeError("left the rendezvous before the trainer entered it")
        if time.monotonic() > deadline:
            rank = next(i + 1 for i, k in enumerate(keys) if not store.check([k]))
            return rank, TimeoutError(f"did not reach the store within {timeout_s:.0f} s.")
    return None


def _first_failure(refs: Sequence[Any], timeout_s: float) -> tuple[int, BaseException] | None:
    """``(rank, error)`` of the first of ``refs`` (rank i + 1) to fail or time out, None if all succeed."""
    import ray
    rank_of = {ref: i + 1 for i, ref in enumerate(refs)}
    pending, deadline = list(refs), time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            return rank_of[pending[0]], TimeoutError(f"no answer within {timeout_s:.0f} s")
        try:
            ray.get(ready[0])
        except Exception as e:      # died, timed out in the rendezvous, no NCCL, unreachable store, ...
            return rank_of[ready[0]], e
    return None


def _named_tensors(weights: Any) -> list[tuple[str, Any]]:
    import torch
    if isinstance(weights, torch.nn.Module):
        weights = weights.state_dict().items()
    elif isinstance(weights, Mapping):
        weights = weights.items()
    return [(k, v.detach()) for k, v in weights]


class RayPolicyPool(TokenBackend):
    """A policy whose ``generate`` runs on ``num_workers`` Ray actors (each a full engine).

    ``weight_transfer``: how :meth:`sync_weights` moves the weights — ``"object_store"``,
    ``"collective"`` (a gloo / NCCL group, see the module docstring) or ``"auto"`` (= collective: even
    on 2 CPU cores gloo pushed SmolLM2-135M in 1.38 s against the object store's 2.16 s; on GPUs NCCL
    keeps the weights on the devices). ``weight_bucket_mb``: the size of the packed buffers a collective
    push broadcasts (one per bucket instead of one per tensor). ``weight_sync_timeout_s``: how long
    the group set-up and every broadcast may take before they fail with an error. ``dtype``: the engines'
    weights' dtype, as :func:`~agentgym.policies.placement.place_sampler` gives one engine (None: the default).
    """

    supports_weight_sync = True
    separate_engine = True      # each actor is a full engine with its own weights

    def __init__(self, spec: str, *, num_workers: int = 2, backend: str | None = None, seed: int = 0,
                 address: str | None = None, resources: Mapping[str, Any] | None = None,
                 threads_per_worker: int = 1, weight_transfer: str = "auto", weight_bucket_mb: float = 256,
                 weight_sync_timeout_s: float = 300.0, dtype: Any = None, **options: Any):
        import ray

        from agentgym.policies.loading import load_tokenizer_for
        from agentgym.policies.backends import backend_names
        from agentgym.ray_envs import ensure_ray
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        backend = backend or backend_names()[0]   # None: the registry's fallback (hf), in every actor alike
        self.weight_transfer = weight_transfer
        if weight_bucket_mb < 0 or weight_sync_timeout_s <= 0:
            raise ValueError("weight_bucket_mb must be >= 0 and weight_sync_timeout_s > 0")
        self.bucket_bytes = int(weight_bucket_mb * 2**20)
        self.timeout_s = float(weight_sync_timeout_s)
        self._side = _TrainerSide()
        self._failed = False            # a group set-up or push failed: actors may be stuck in it
        self._release = weakref.finalize(self, self._side.release)
        self.workers: list[Any] = []
        self.last_load_s = 0.0          # the slowest actor's own load time (policy.sync_weights) in the last push
        ensure_ray(address)
        self.tokenizer = load_tokenizer_for(spec)
        self.name = f"{spec} x{num_workers} ({backend})"
        cls = ray.remote(_PolicyHost).options(**dict(resources or {"num_cpus": threads_per_worker}))
        self.workers = [cls.remote(spec, backend, seed, options, threads_per_worker, dtype) for _ in range(num_workers)]
        # loaded (errors surface here, not mid-rollout); each actor's GPU decides the collective's backend
        self._worker_gpus = ray.get([w.gpu.remote() for w in self.workers])

    @property
    def weight_transfer(self) -> str:
        """``"auto"``, ``"object_store"`` or ``"collective"``; may be changed between pushes (e.g. to fall
        back to the object store where the workers cannot reach the trainer over TCP)."""
        return self._weight_transfer

    @weight_transfer.setter
    def weight_transfer(self, value: str) -> None:
        self._weight_transfer = check_weight_transfer(value)

    @property
    def transport(self) -> str:
        """The transport :meth:`sync_weights` uses: ``"object_store"`` or ``"collective"``."""
        return "object_store" if self.weight_transfer == "object_store" else "collective"

    @property
    def collective_backend(self) -> str | None:
        """``"gloo"`` / ``"nccl"`` once a collective push has opened the group, else None."""
        return self._side.group.backend if self._side.group is not None else None

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        import ray
        prompts = [list(p) for p in prompts]
        n = len(self.workers)
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        calls = []
        for i, w in enumerate(self.workers):
            share = prompts[bounds[i]:bounds[i + 1]]
            if share:
                sp = sampling if sampling.seed is None else sampling.replace(seed=sampling.seed + 1_000_003 * i)
                calls.append(w.generate.remote(share, sp))
        return [g for part in ray.get(calls) for g in part]

    def sync_weights(self, weights: Any) -> float:
        """Push new weights (an ``nn.Module``, a state dict or ``(name, tensor)`` pairs) to every actor
        and wait until all of them have loaded them; returns the wall seconds."""
        t0 = time.perf_counter()
        if not self.workers:
            raise RuntimeError("sync_weights on a closed RayPolicyPool")
        named = _named_tensors(weights)
        if self.transport == "object_store":
            self._push_object_store(named)
        else:
            self._push_collective(named)
        return time.perf_counter() - t0

    def _push_object_store(self, named: list[tuple[str, Any]]) -> None:
        import ray
        ref = ray.put({k: v.to("cpu") for k, v in named})
        self.last_load_s = max(ray.get([w.sync_weights.remote(ref) for w in self.workers]))

    def _push_collective(self, named: list[tuple[str, Any]]) -> None:
        import ray
        import torch
        if not named:
            raise ValueError("sync_weights got no tensors")
        device = named[0][1].device
        backend = collective_backend(_gpu_uuid(device), self._worker_gpus)
        wire = device if backend == "nccl" else torch.device("cpu")
        group = self._side.group
        if group is None or group.backend != backend or group.device != wire:
            group = self._open_group(backend, wire)
        entries, sizes = plan_buckets(named, self.bucket_bytes)
        done = [w.receive_weights.remote(entries, sizes) for w in self.workers]
        try:
            for b, size in enumerate(sizes):
                group.broadcast(_pack(named, entries, b, size, wire))
        except Exception as e:
            self._failed = True
            self._side.release()        # a broken group is not reused: the next push opens a new one
            raise RuntimeError(f"collective weight push ({backend}) failed: {e}") from e
        self.last_load_s = max(ray.get(done))

    def _open_group(self, backend: str, device: Any) -> _WeightGroup:
        """Rendezvous of the trainer (rank 0) and the actors (ranks 1..N) in a new group."""
        import ray
        import torch.distributed as dist
        self._side.release()            # (an actor leaves its old group when it joins the new one)
        host, world, t = ray.util.get_node_ip_address(), len(self.workers) + 1, self.timeout_s
        advice = ("set weight_transfer='object_store' to push through Ray's object store instead")
        try:
            store = dist.TCPStore(host, 0, world, is_master=True, timeout=timedelta(seconds=t),
                                  wait_for_workers=False)
        except Exception as e:
            raise RuntimeError(f"collective weight transfer: cannot open a TCPStore on {host} "
                               f"(free port): {e}; {advice}") from e
        where = f"{host}:{store.port}"
        joined = [w.join_weight_group.remote(backend, host, store.port, i + 1, world, t)
                  for i, w in enumerate(self.workers)]
        # Rank 0 enters the group only once every actor has reached the store: a rank that cannot (dead,
        # unreachable) is reported at once, and this thread never sits in a rendezvous that cannot finish.
        failure = _wait_until_ready(store, joined, t)
        who = "rollout worker"
        if failure is None:
            try:
                group = _WeightGroup(backend, store, 0, world, t, host, device)
            except Exception as e:
                failure, who = (0, e), "trainer"
        if failure is None:
            failure = _first_failure(joined, t + 30)
        if failure is not None:
            self._failed = True
            rank, error = failure
            cause = (str(error).strip().splitlines() or [""])[0]
            raise RuntimeError(
                f"collective weight transfer ({backend}): the trainer (rank 0, store at {where}) and "
                f"{len(self.workers)} rollout workers could not form a process group within {t:.0f} s; "
                f"{who} rank {rank} failed with {type(error).__name__}: {cause} The workers must reach "
                f"{where} over TCP; {advice}"
            ) from error
        self._side.group, self._failed = group, False
        return group

    def close(self) -> None:
        """Leave the weight group on both sides and end the actors; safe to call twice."""
        import ray
        workers, self.workers = self.workers, []
        for w in workers if not self._failed else []:   # after a failed collective: just end them
            try:
                ray.get(w.close.remote(), timeout=30)
            except Exception:
                pass
        self._release()                 # the trainer's side of the group (once; also run on GC)
        for w in workers:
            try:
                ray.kill(w)
            except Exception:
                pass
