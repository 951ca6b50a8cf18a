"""Process-group helpers: one code path for 1 process and for ``torchrun`` ranks.

``torchrun --nproc-per-node N -m attnkit train ...`` sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; :func:`init_distributed` then joins the group with gloo (CPU) or nccl (CUDA).
Without those variables everything here degrades to single-process no-ops.

Rank 0 reports the run; the other ranks log warnings and errors only (each printed every
progress line a second time on the terminal).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits among the training processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0, the only process that writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(spec: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> this rank's CUDA device when available, else CPU; otherwise ``spec``."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"optim.device={spec!r} but CUDA is not available")
    return device


def init_distributed(device_spec: str = "auto") -> DistInfo:
    """Joins the process group described by torchrun's environment, if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo(device=pick_device(device_spec))
    rank = int(os.environ["RANK"])
    if rank != 0:
        quiet_logging()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    device = pick_device(device_spec, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    logger.info("rank %d of %d on %s (%s)", rank, world_size, device, dist.get_backend())
    return DistInfo(rank, world_size, local_rank, local_world_size, device)


def quiet_logging() -> None:
    """Warnings and errors only from attnkit's loggers in this process (a rank other than 0:
    rank 0 logs the run's progress, the others would repeat it line by line)."""
    root = logging.getLogger("attnkit")
    if root.getEffectiveLevel() < logging.WARNING:
        root.setLevel(logging.WARNING)


# How long close_distributed leaves the interpreter lock to gloo's worker threads (below).
GLOO_SETTLE_SECONDS = 0.2


def close_distributed(*, wait_for_peers: bool = True) -> None:
    """Leaves the process group (safe to call when there is none).

    Before that it waits: at a barrier (with ``wait_for_peers``: every rank must call it
    then; after a failure that other ranks may not have seen, pass False, so that this rank
    does not wait for peers that wait elsewhere), then :data:`GLOO_SETTLE_SECONDS` asleep.
    gloo's worker threads destroy each finished collective's work, and a work that holds
    tensors Python made (those of ``all_gather_object`` and ``broadcast_object_list``; a
    barrier's work holds the works before it) needs the interpreter lock to let go of them.
    The process group itself is destroyed when its last reference goes (DDP's reducer holds
    one), by a thread that holds that lock while it waits for the workers to end: if a worker
    is still waiting for the lock then, the process never exits. torchrun runs hung so after
    "done" when the machine was busy (4 of 20 runs of the DDP test with three busy processes
    on two cores with the barrier alone, none in 25 with the sleep; py-spy showed
    ``~ProcessGroupGloo`` joining a thread in ``~AsyncBarrierWork`` ->
    ``~AsyncAllgatherWork`` -> ``gil_scoped_acquire``). Asleep, this thread leaves the lock
    to them.
    """
    if dist.is_available() and dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        time.sleep(GLOO_SETTLE_SECONDS)
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sums ``tensor`` over ranks in place (and returns it); a no-op for one process."""
    if info.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_min(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The element-wise minimum of ``tensor`` over ranks, in place (and returned)."""
    if info.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return tensor


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not info.distributed:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


class PeerError(RuntimeError):
    """Raised on the ranks that did not fail when another rank's check failed."""


@contextlib.contextmanager
def raise_together(info: DistInfo) -> Iterator[None]:
    """Makes every rank raise when any rank raises inside the block (a collective: all ranks
    must enter it).

    A check that only rank 0 makes (is the run folder free? does the tokenizer train?) would
    otherwise leave the other ranks waiting forever at the next collective. At the end of the
    block the ranks exchange their errors: a failed rank re-raises its own, the others raise
    ``ValueError`` (for a ``ValueError`` on the failed rank, so the command line prints it
    as a usage error) or :class:`PeerError` carrying the first failed rank's message.
    """
    if not info.distributed:
        yield
        return
    try:
        yield
    except Exception as err:
        gather_objects((type(err).__name__, str(err), isinstance(err, ValueError)), info)
        raise
    gathered = gather_objects(None, info)  # in rank order; a failed rank sent a tuple
    failed = [rank for rank, f in enumerate(gathered) if f is not None]
    if failed:
        name, message, is_value_error = gathered[failed[0]]
        error = ValueError if is_value_error else PeerError
        raise error(f"{message} (raised as {name} on rank {failed[0]})")
