"""Operator-name normalization: framework, c10d, NCCL kernel and NCCL Inspector names -> CommOps ops."""

from __future__ import annotations

import re

__all__ = ["BACKEND_PREFIXES", "normalize_op", "strip_backend"]

BACKEND_PREFIXES = ("nccl", "ncclx", "gloo", "xccl", "mpi", "ucc", "hccl", "rccl", "fake", "custom")

_BACKEND_RE = re.compile(r"^\s*(?:" + "|".join(BACKEND_PREFIXES) + r")\s*:\s*", re.IGNORECASE)
_KERNEL_RE = re.compile(r"^nccl(?:dev)?kernel_?([a-z]+)", re.IGNORECASE)

# compact (lower-case, alphanumerics only) name prefixes -> CommOps op, checked in this order
_PREFIX_MAP: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("bcast", "broadcast"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("isend", "send"),
    ("send", "send"),
    ("irecv", "recv"),
    ("recv", "recv"),
)
# compact names that look like a prefix above but are something else
_NOT_OPS = {"sendrecv", "reducecoalesced_", "recvanysource"}


def strip_backend(name: str) -> str:
    """``'nccl:send 0->3'`` -> ``'send 0->3'`` (any known backend prefix, any case)."""
    return _BACKEND_RE.sub("", name, count=1)


def normalize_op(name: str | None) -> str | None:
    """Map a framework's operator name to a CommOps v1 op name, or None when unknown.

    Accepts PyTorch ``Collective name`` values and ``profiling_name`` strings with any backend
    prefix (``nccl:``, ``gloo:``, ``ncclx:``, ``xccl:``...), c10d function names
    (``_allgather_base``, ``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor``,
    ``alltoall_base``, ``_reduce_scatter_base``...), NCCL kernel names (``ncclKernel_AllReduce_*``,
    ``ncclDevKernel_ReduceScatter_*``) and NCCL Inspector names (``AllGather``, ``Send``...).

    Examples
    --------
    >>> [normalize_op(n) for n in ("nccl:_all_gather_base", "allgather_into_tensor_coalesced",
    ...                            "gloo:reduce_scatter_tensor", "alltoall_base", "nccl:send 0->3",
    ...                            "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ReduceScatter", "gather")]
    ['all_gather', 'all_gather', 'reduce_scatter', 'all_to_all', 'send', 'all_reduce', 'reduce_scatter', None]
    """
    if not name or not isinstance(name, str):
        return None
    s = strip_backend(name.strip())
    s = re.sub(r"^(?:c10d|torch\.distributed|dist)\s*(?:::|\.)\s*", "", s)
    m = _KERNEL_RE.match(s)
    if m:
        s = m.group(1)
    s = s.split()[0] if s.split() else s
    compact = re.sub(r"[^a-z0-9]", "", s.lower())
    if compact in _NOT_OPS:
        return None
    for prefix, op in _PREFIX_MAP:
        if compact.startswith(prefix):
            return op
    return None
