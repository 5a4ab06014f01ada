"""Data parallelism of one update over the ranks of a torch.distributed process group: which
micro-batches a rank computes, and the sums that make its gradient the whole batch's.

The trainer (rl/trainer.py) splits each mini-batch into micro-batches exactly as in one
process; rank r of W computes micro-batches r, r+W, r+2W, ... (`RankShare.mine`). Every loss
is already normalised by the WHOLE mini-batch's token (or sequence) count (rl/losses.py's
`normalizer`), so the mini-batch gradient is the plain SUM of the micro-batch gradients, and
`all_reduce_gradients` sums the ranks' partial sums (all_reduce SUM). The result is the
single-process gradient up to float rounding: the same terms, added in another order.
Nothing is averaged over ranks (DDP's averaging would divide by W), and a rank with fewer
micro-batches (or none) adds zeros. A parameter no rank has a gradient for stays without one,
as in one process (AdamW then skips it). Every rank then clips and steps the same summed
gradient, so the ranks' weights stay identical without a broadcast.

Why not torch's DistributedDataParallel wrapper: its hooks all-reduce inside each backward and
need every rank to run the same number of backward passes; here ranks hold unequal numbers of
micro-batches, gradients accumulate over several, fp32 master weights (rl/precision.py) hold
a bf16 model's gradients, and one all-reduce per optimizer step is all the sum needs.
`broadcast_training_state` copies rank 0's weights and optimizer state to the others (after
rank 0 alone changed them: the warm-start, a reset of the KL reference).

What it does not: start processes or the process group (workers/trainer_rank.py), or shard
parameters (FSDP: every rank holds the whole model and optimizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rlpipe.core.failpoints import failpoint

T = TypeVar("T")


@dataclass(frozen=True)
class RankShare:
    """This process's place in the update's process group (rank 0 of 1: no group)."""

    rank: int = 0
    world: int = 1

    def mine(self, chunks: Sequence[T]) -> list[T]:
        """The micro-batches this rank computes: every world-th, from its rank on."""
        return list(chunks[self.rank :: self.world])

    @property
    def distributed(self) -> bool:
        return self.world > 1


def all_reduce_gradients(tensors: Sequence[torch.Tensor], share: RankShare) -> None:
    """Sum every tensor's `.grad` over the ranks in place (one flat all-reduce per dtype);
    a tensor without a gradient on a rank adds zeros; one without a gradient on every rank
    keeps none."""
    if not share.distributed:
        return
    failpoint(f"all-reduce-rank-{share.rank}", whole_run=False)  # tests: a rank dies before the collective
    device = tensors[0].device
    has_grad = torch.tensor([tensor.grad is not None for tensor in tensors], dtype=torch.int32, device=device)
    dist.all_reduce(has_grad, op=dist.ReduceOp.MAX)
    with_grad = [tensor for tensor, flag in zip(tensors, has_grad.tolist()) if flag]
    for tensor in with_grad:
        if tensor.grad is None:
            tensor.grad = torch.zeros_like(tensor)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in with_grad:
        by_dtype.setdefault(tensor.grad.dtype, []).append(tensor)
    for group in by_dtype.values():
        flat = torch.cat([tensor.grad.reshape(-1) for tensor in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for tensor in group:
            size = tensor.grad.numel()
            tensor.grad.copy_(flat[offset : offset + size].view_as(tensor.grad))
            offset += size


def all_reduce_floats(values: Sequence[float], share: RankShare, device: torch.device) -> list[float]:
    """The sums of `values` over the ranks (float64), in the same order."""
    if not share.distributed:
        return list(values)
    summed = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed.tolist()


def broadcast_module(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers into every rank's copy of `module`, in place."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def broadcast_object(value: Any, device: torch.device) -> Any:
    """Rank 0's `value` (picklable: an optimizer state, a version) on every rank."""
    holder = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0, device=device if device.type == "cuda" else None)
    return holder[0]
