"""Parallel layouts: which ranks form which communicator in a Megatron-style training job.

A :class:`ParallelLayout` reproduces the rank groups of Megatron-LM's ``RankGenerator``
(``megatron/core/parallel_state.py``) exactly. A rank is decomposed along the dimensions of the
order string, the first token varying fastest::

    rank = sum(coord[t] * stride[t]),  stride[t] = product of the sizes of the tokens before t

Two decompositions exist, as in Megatron:

* the *dense* one (attention / dense layers): sizes ``tp, cp, dp, pp`` (``ep`` counted as 1);
* the *expert* one (MoE layers): sizes ``tp=etp, ep, dp=expert_dp, pp`` (``cp`` counted as 1),
  with ``expert_dp = tp * cp * dp // (etp * ep)``.

A group of kind ``k`` holds the ranks that differ only in the coordinates named by ``k``;
groups are numbered in Megatron's generation order (the unmasked coordinates enumerate groups,
first token fastest), which is the ``i`` of the communicator id ``f"{kind}-{i}"``.

Group kinds (``ParallelLayout.groups``) and the Megatron process group each one reproduces:

==================== ===========================================================
kind                 Megatron group (``group_desc``)
==================== ===========================================================
``tp``               TENSOR_MODEL_PARALLEL_GROUP
``cp``               CONTEXT_PARALLEL_GROUP
``dp``               DATA_PARALLEL_GROUP (data parallel without cp)
``dp_cp``            DATA_PARALLEL_GROUP_WITH_CP
``pp``               PIPELINE_MODEL_PARALLEL_GROUP
``mp``               MODEL_PARALLEL_GROUP (tp x pp)
``tp_cp``            TENSOR_AND_CONTEXT_PARALLEL_GROUP
``tp_dp``            TENSOR_AND_DATA_PARALLEL_GROUP
``tp_dp_cp``         TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP
``ep``               EXPERT_MODEL_PARALLEL_GROUP
``etp``              EXPERT_TENSOR_PARALLEL_GROUP
``edp``              EXPERT_DATA_PARALLEL_GROUP
``etp_ep``           EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP
``etp_ep_pp``        EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP
``embedding``        EMBEDDING_GROUP (first and last stage of each pp group)
``position_embedding`` POSITION_EMBEDDING_GROUP (first stage of each pp group)
==================== ===========================================================

Examples
--------
>>> lay = ParallelLayout(tp=2, pp=2, dp=2)
>>> lay.groups("dp")
[(0, 2), (1, 3), (4, 6), (5, 7)]
>>> lay.comm_id_of(5, "pp"), lay.pp_prev(5)
('pp-1', 1)
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from holmes.errors import LayoutError

__all__ = [
    "KINDS",
    "GROUP_KINDS",
    "MEGATRON_GROUP_KINDS",
    "Communicator",
    "ParallelLayout",
    "kind_from_group_name",
    "infer_layout",
]

logger = logging.getLogger(__name__)

#: Communicator kinds used in job.json and CommOps.
KINDS = ("dp", "tp", "pp", "ep", "cp", "other")

_TOKENS = ("tp", "cp", "ep", "dp", "pp")

# group kind -> (decomposition, tokens whose coordinates vary inside a group)
_GROUP_SPECS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("dense", ("tp",)),
    "cp": ("dense", ("cp",)),
    "dp": ("dense", ("dp",)),
    "dp_cp": ("dense", ("dp", "cp")),
    "pp": ("dense", ("pp",)),
    "mp": ("dense", ("tp", "pp")),
    "tp_cp": ("dense", ("tp", "cp")),
    "tp_dp": ("dense", ("tp", "dp")),
    "tp_dp_cp": ("dense", ("tp", "dp", "cp")),
    "ep": ("expert", ("ep",)),
    "etp": ("expert", ("tp",)),
    "edp": ("expert", ("dp",)),
    "etp_ep": ("expert", ("tp", "ep")),
    "etp_ep_pp": ("expert", ("tp", "ep", "pp")),
}

#: Every kind :meth:`ParallelLayout.groups` accepts.
GROUP_KINDS = (*_GROUP_SPECS, "embedding", "position_embedding")

#: Megatron ``group_desc`` -> the :meth:`ParallelLayout.groups` kind that reproduces it.
MEGATRON_GROUP_KINDS: dict[str, str] = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "MODEL_PARALLEL_GROUP": "mp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp_dp",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "etp",
    "EXPERT_DATA_PARALLEL_GROUP": "edp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "etp_ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "etp_ep_pp",
    "EMBEDDING_GROUP": "embedding",
    "POSITION_EMBEDDING_GROUP": "position_embedding",
}

# communicator kind -> group kind whose groups are its communicators
_COMM_GROUP = {"tp": "tp", "cp": "cp", "dp": "dp_cp", "ep": "ep", "pp": "pp", "edp": "edp"}


@dataclass(frozen=True)
class Communicator:
    """One communicator (process group): its kind and its member ranks, ascending.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    ranks : tuple of int
        Global ranks of the members; stored sorted ascending.

    Raises
    ------
    LayoutError
        If ``kind`` is unknown or ``ranks`` is empty, negative or has duplicates.

    Examples
    --------
    >>> Communicator("tp", (3, 2))
    Communicator(kind='tp', ranks=(2, 3))
    """

    kind: str
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LayoutError(f"communicator kind {self.kind!r} is not one of {', '.join(KINDS)}")
        try:
            ranks = tuple(sorted(int(r) for r in self.ranks))
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"communicator ranks {self.ranks!r} are not integers") from exc
        if not ranks or ranks[0] < 0 or len(set(ranks)) != len(ranks):
            raise LayoutError(
                f"communicator ranks {list(ranks)} must be non-empty, non-negative and distinct"
            )
        object.__setattr__(self, "ranks", ranks)


def _masked_groups(sizes: Sequence[int], mask: Sequence[bool]) -> np.ndarray:
    """Megatron's ``generate_masked_orthogonal_rank_groups``, vectorized.

    Returns an int64 array of shape (num_groups, group_size); row i is group i.
    """
    n = len(sizes)
    world = int(np.prod(sizes))
    # axis j of `grid` is token n-1-j (first token fastest in row-major order)
    grid = np.arange(world, dtype=np.int64).reshape(tuple(reversed(sizes)))
    unmasked = [i for i in range(n) if not mask[i]]
    masked = [i for i in range(n) if mask[i]]
    axes = [n - 1 - i for i in reversed(unmasked)] + [n - 1 - i for i in reversed(masked)]
    group_size = int(np.prod([sizes[i] for i in masked])) if masked else 1
    return np.ascontiguousarray(grid.transpose(axes).reshape(world // group_size, group_size))


def _check_degree(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise LayoutError(f"parallel degree {name}={value!r} must be an integer >= 1")
    return int(value)


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees and rank order of a Megatron-style 5-D parallel layout.

    Parameters
    ----------
    tp, pp, dp, cp, ep : int
        Tensor, pipeline, data, context and expert parallel degrees;
        ``world_size = tp * cp * dp * pp`` (expert groups are carved out of ``tp * cp * dp``).
    etp : int or None
        Expert tensor-parallel degree; ``None`` means ``tp``.
    order : str
        Megatron rank order, first token fastest. Must contain tp, dp and pp exactly once;
        cp and ep may be omitted when their degree is 1 (then appended, as Megatron does).

    Raises
    ------
    LayoutError
        On a degree < 1, a malformed order, ``tp*cp*dp`` not divisible by ``etp*ep``, or an
        order under which dense and expert pipeline groups differ (Megatron rejects these too).

    Notes
    -----
    :meth:`communicators` returns one communicator per group of kinds tp, cp, dp, ep and pp with
    more than one member. Kind ``"dp"`` communicators are the gradient-reduction groups, i.e.
    Megatron's DATA_PARALLEL_GROUP_WITH_CP (equal to DATA_PARALLEL_GROUP when ``cp == 1``), so
    they exist whenever ``dp * cp > 1``.

    Examples
    --------
    >>> lay = ParallelLayout(tp=2, pp=2, dp=2)
    >>> lay.world_size, lay.groups("tp")[:2], lay.groups("pp")[:2]
    (8, [(0, 1), (2, 3)], [(0, 4), (1, 5)])
    >>> sorted(lay.communicators())[:3]
    ['dp-0', 'dp-1', 'dp-2']
    >>> lay.coords(5)
    {'tp': 1, 'cp': 0, 'dp': 0, 'pp': 1, 'ep': 0}
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    order: str = "tp-cp-ep-dp-pp"

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep"):
            object.__setattr__(self, name, _check_degree(name, getattr(self, name)))
        if self.etp is not None:
            object.__setattr__(self, "etp", _check_degree("etp", self.etp))
        if not isinstance(self.order, str):
            raise LayoutError(f"order must be a string like 'tp-cp-ep-dp-pp', got {self.order!r}")
        order = self.order.strip().lower()
        object.__setattr__(self, "order", order)
        tokens = order.split("-")
        bad = [t for t in tokens if t not in _TOKENS]
        if bad:
            raise LayoutError(
                f"order {self.order!r} has unknown token(s) {bad}; use tp, cp, ep, dp, pp"
            )
        dup = sorted({t for t in tokens if tokens.count(t) > 1})
        if dup:
            raise LayoutError(f"order {self.order!r} repeats {dup}")
        for t in ("tp", "dp", "pp"):
            if t not in tokens:
                raise LayoutError(f"order {self.order!r} lacks {t!r}")
        for t in ("cp", "ep"):
            if t not in tokens and getattr(self, t) > 1:
                raise LayoutError(f"{t}={getattr(self, t)} > 1 but order {self.order!r} lacks {t!r}")
        full = tokens + [t for t in _TOKENS if t not in tokens]
        etp = self.expert_tp
        if (self.tp * self.cp * self.dp) % (etp * self.ep) != 0:
            raise LayoutError(
                f"tp*cp*dp = {self.tp * self.cp * self.dp} is not divisible by "
                f"etp*ep = {etp * self.ep} (tp={self.tp}, cp={self.cp}, dp={self.dp}, "
                f"etp={etp}, ep={self.ep})"
            )
        dense = {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        expert = {"tp": etp, "cp": 1, "ep": self.ep, "dp": self.expert_dp, "pp": self.pp}
        object.__setattr__(self, "_tokens", tuple(full))
        object.__setattr__(self, "_sizes", {"dense": dense, "expert": expert})
        object.__setattr__(self, "_cache", {})
        if self.pp > 1 and full[-1] != "pp" and tokens[-1] != "pp":
            if not np.array_equal(self._array("pp"), self._expert_pp()):
                raise LayoutError(
                    f"order {self.order!r}: dense and expert pipeline groups differ "
                    f"(Megatron requires pp last or expert_dp == dp with matching strides)"
                )

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        """Number of ranks, ``tp * cp * dp * pp``."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree (``etp``, defaulting to ``tp``)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel degree, ``tp * cp * dp // (etp * ep)``."""
        return (self.tp * self.cp * self.dp) // (self.expert_tp * self.ep)

    def degree(self, kind: str) -> int:
        """Size of each group of ``kind`` (see :data:`GROUP_KINDS`).

        >>> ParallelLayout(tp=2, dp=4, ep=2).degree("edp")
        2
        """
        if kind in ("embedding", "position_embedding"):
            return len(self.groups(kind)[0])
        return int(self._array(kind).shape[1])

    # ------------------------------------------------------------------ groups
    def _array(self, kind: str) -> np.ndarray:
        cache: dict = self._cache  # type: ignore[attr-defined]
        arr = cache.get(("arr", kind))
        if arr is None:
            try:
                which, varying = _GROUP_SPECS[kind]
            except KeyError:
                raise LayoutError(
                    f"unknown group kind {kind!r}; expected one of {', '.join(GROUP_KINDS)}"
                ) from None
            sizes = self._sizes[which]  # type: ignore[attr-defined]
            tokens = self._tokens  # type: ignore[attr-defined]
            arr = _masked_groups([sizes[t] for t in tokens], [t in varying for t in tokens])
            arr.setflags(write=False)
            cache[("arr", kind)] = arr
        return arr

    def _expert_pp(self) -> np.ndarray:
        sizes = self._sizes["expert"]  # type: ignore[attr-defined]
        tokens = self._tokens  # type: ignore[attr-defined]
        return _masked_groups([sizes[t] for t in tokens], [t == "pp" for t in tokens])

    def group_array(self, kind: str) -> np.ndarray:
        """Groups of ``kind`` as a read-only int64 array (num_groups, group_size).

        >>> ParallelLayout(tp=2, dp=2).group_array("dp").tolist()
        [[0, 2], [1, 3]]
        """
        if kind in ("embedding", "position_embedding"):
            return np.array(self.groups(kind), dtype=np.int64)
        return self._array(kind)

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """Rank groups of ``kind`` in Megatron's generation order.

        Parameters
        ----------
        kind : str
            One of :data:`GROUP_KINDS` (tp, cp, dp, dp_cp, pp, mp, tp_cp, tp_dp, tp_dp_cp, ep,
            etp, edp, etp_ep, etp_ep_pp, embedding, position_embedding).

        Examples
        --------
        >>> ParallelLayout(tp=2, pp=2, dp=2).groups("mp")
        [(0, 1, 4, 5), (2, 3, 6, 7)]
        >>> ParallelLayout(pp=4, dp=2).groups("embedding")
        [(0, 6), (1, 7)]
        """
        cache: dict = self._cache  # type: ignore[attr-defined]
        out = cache.get(("list", kind))
        if out is None:
            if kind in ("embedding", "position_embedding"):
                pp = self._array("pp")
                cols = [0] if kind == "position_embedding" or pp.shape[1] == 1 else [0, -1]
                out = [tuple(row) for row in pp[:, cols].tolist()]
            else:
                out = [tuple(row) for row in self._array(kind).tolist()]
            cache[("list", kind)] = out
        return list(out)

    def _index(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(group index, position in group) of every rank for ``kind``."""
        cache: dict = self._cache  # type: ignore[attr-defined]
        got = cache.get(("idx", kind))
        if got is None:
            arr = self._array(kind)
            gid = np.empty(self.world_size, dtype=np.int64)
            pos = np.empty(self.world_size, dtype=np.int64)
            gid[arr] = np.arange(arr.shape[0])[:, None]
            pos[arr] = np.arange(arr.shape[1])[None, :]
            got = (gid, pos)
            cache[("idx", kind)] = got
        return got

    def _rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise LayoutError(f"rank {rank!r} is not an integer")
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside world_size {self.world_size}")
        return int(rank)

    def group_of(self, rank: int, kind: str) -> tuple[int, ...]:
        """The group of ``kind`` that ``rank`` belongs to.

        >>> ParallelLayout(tp=2, pp=2, dp=2).group_of(6, "dp")
        (4, 6)
        """
        rank = self._rank(rank)
        if kind in ("embedding", "position_embedding"):
            for g in self.groups(kind):
                if rank in g:
                    return g
            raise LayoutError(f"rank {rank} is in no {kind} group")
        gid, _ = self._index(kind)
        return tuple(self._array(kind)[gid[rank]].tolist())

    def group_index(self, rank: int, kind: str) -> int:
        """Index (Megatron generation order) of the group of ``kind`` holding ``rank``.

        >>> ParallelLayout(tp=2, pp=2, dp=2).group_index(6, "dp")
        2
        """
        return int(self._index(kind)[0][self._rank(rank)])

    def comm_id_of(self, rank: int, kind: str) -> str:
        """Communicator id (as in :meth:`communicators`) of ``rank`` for a communicator kind.

        ``kind`` is tp, cp, dp, ep, pp or edp; raises :class:`LayoutError` if that dimension
        has no communicators (degree 1).

        >>> ParallelLayout(tp=2, pp=2, dp=2).comm_id_of(3, "tp")
        'tp-1'
        """
        gkind = _COMM_GROUP.get(kind)
        if gkind is None:
            raise LayoutError(f"unknown communicator kind {kind!r}; use {', '.join(_COMM_GROUP)}")
        if self._array(gkind).shape[1] < 2:
            raise LayoutError(f"layout {self} has no {kind} communicators (degree 1)")
        return f"{kind}-{int(self._index(gkind)[0][self._rank(rank)])}"

    def communicators(self, *, expert_data: bool = False) -> dict[str, Communicator]:
        """Communicator id -> :class:`Communicator` for every group with two or more ranks.

        Ids are ``f"{kind}-{i}"``, ``i`` the group index in Megatron's generation order, for
        kinds tp, cp, dp (= DATA_PARALLEL_GROUP_WITH_CP, the gradient-reduction groups), ep and
        pp. With ``expert_data=True`` the expert data-parallel groups (EXPERT_DATA_PARALLEL_GROUP)
        are added as ``edp-<i>`` of kind ``"dp"``.

        Examples
        --------
        >>> comms = ParallelLayout(tp=2, pp=2, dp=2).communicators()
        >>> comms["tp-0"], comms["pp-3"]
        (Communicator(kind='tp', ranks=(0, 1)), Communicator(kind='pp', ranks=(3, 7)))
        """
        out: dict[str, Communicator] = {}
        kinds = ["tp", "cp", "dp", "ep", "pp"] + (["edp"] if expert_data else [])
        for kind in kinds:
            arr = self._array(_COMM_GROUP[kind])
            if arr.shape[1] < 2:
                continue
            ckind = "dp" if kind == "edp" else kind
            for i, row in enumerate(arr.tolist()):
                out[f"{kind}-{i}"] = Communicator(ckind, tuple(row))
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank``: tp, cp, dp, pp (dense decomposition) and ep (its position
        in its expert-parallel group).

        >>> ParallelLayout(tp=2, pp=2, dp=2).coords(6)
        {'tp': 0, 'cp': 0, 'dp': 1, 'pp': 1, 'ep': 0}
        """
        rank = self._rank(rank)
        sizes = self._sizes["dense"]  # type: ignore[attr-defined]
        out: dict[str, int] = {}
        stride = 1
        for t in self._tokens:  # type: ignore[attr-defined]
            out[t] = (rank // stride) % sizes[t]
            stride *= sizes[t]
        return {
            "tp": out["tp"],
            "cp": out["cp"],
            "dp": out["dp"],
            "pp": out["pp"],
            "ep": int(self._index("ep")[1][rank]),
        }

    def _pp_step(self, rank: int, step: int) -> int | None:
        rank = self._rank(rank)
        gid, pos = self._index("pp")
        j = int(pos[rank]) + step
        if not 0 <= j < self.pp:
            return None
        return int(self._array("pp")[gid[rank], j])

    def pp_next(self, rank: int) -> int | None:
        """The next pipeline stage's rank in ``rank``'s pp group, ``None`` on the last stage.

        >>> ParallelLayout(tp=2, pp=2, dp=2).pp_next(1), ParallelLayout(tp=2, pp=2).pp_next(3)
        (5, None)
        """
        return self._pp_step(rank, 1)

    def pp_prev(self, rank: int) -> int | None:
        """The previous pipeline stage's rank, ``None`` on the first stage.

        >>> ParallelLayout(tp=2, pp=2, dp=2).pp_prev(5)
        1
        """
        return self._pp_step(rank, -1)

    def to_dict(self) -> dict[str, object]:
        """The ``parallel`` object of job.json.

        >>> ParallelLayout(tp=2, pp=2).to_dict()
        {'tp': 2, 'pp': 2, 'dp': 1, 'cp': 1, 'ep': 1, 'order': 'tp-cp-ep-dp-pp'}
        """
        out: dict[str, object] = {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep,
        }
        if self.etp is not None:
            out["etp"] = self.etp
        out["order"] = self.order
        return out


# ---------------------------------------------------------------------- group names -> kinds

_EXACT_KIND = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP_AG": "dp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_DATA_PARALLEL_GROUP": "dp",
    "INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "dp",
    "INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "dp",
    "EXPERT_TENSOR_PARALLEL_GROUP": "tp",
}
# Megatron names that deliberately map to "other" (mixtures of dimensions, or bookkeeping).
_EXACT_OTHER = {
    "DEFAULT_PG", "MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP",
    "TENSOR_AND_DATA_PARALLEL_GROUP", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP", "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
}
_ALIASES = {
    "tp": "tp", "tensor": "tp", "tensor_parallel": "tp", "tensor_model_parallel": "tp",
    "etp": "tp", "expert_tensor_parallel": "tp",
    "dp": "dp", "data": "dp", "data_parallel": "dp", "dp_cp": "dp", "ddp": "dp", "fsdp": "dp",
    "edp": "dp", "expert_data_parallel": "dp", "data_parallel_with_cp": "dp",
    "pp": "pp", "pipe": "pp", "pipeline": "pp", "pipeline_parallel": "pp",
    "pipeline_model_parallel": "pp",
    "ep": "ep", "expert": "ep", "expert_parallel": "ep", "expert_model_parallel": "ep",
    "moe": "ep",
    "cp": "cp", "context": "cp", "context_parallel": "cp",
}
_SUFFIXES = ("_group", "_groups", "_gloo", "_pg", "_comm", "_ranks")


def kind_from_group_name(name: str) -> str:
    """Communicator kind (one of :data:`KINDS`) of a process-group name or description.

    Matching is case-insensitive. Megatron descriptions map as follows:

    ============================================== =====
    group description                              kind
    ============================================== =====
    TENSOR_MODEL_PARALLEL_GROUP                    tp
    EXPERT_TENSOR_PARALLEL_GROUP                   tp
    PIPELINE_MODEL_PARALLEL_GROUP                  pp
    DATA_PARALLEL_GROUP, DATA_PARALLEL_GROUP_WITH_CP dp
    EXPERT_DATA_PARALLEL_GROUP                     dp
    INTRA/INTER_PARTIAL_..._DATA_PARALLEL_GROUP... dp
    CONTEXT_PARALLEL_GROUP, HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L<n> cp
    EXPERT_MODEL_PARALLEL_GROUP                    ep
    default_pg, MODEL_PARALLEL_GROUP, EMBEDDING_GROUP, POSITION_EMBEDDING_GROUP,
    TENSOR_AND_DATA_PARALLEL_GROUP[_WITH_CP], TENSOR_AND_CONTEXT_PARALLEL_GROUP,
    INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP, EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP,
    EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP, anything unknown  other
    ============================================== =====

    A ``_GLOO`` suffix is ignored. Short and descriptive forms are accepted too: ``tp``,
    ``tensor``, ``tensor_parallel``, ``dp``, ``data_parallel``, ``fsdp``, ``pp``, ``pipeline``,
    ``ep``, ``expert``, ``moe``, ``cp``, ``context_parallel`` (optionally with ``_group`` /
    ``_pg`` suffixes, ``-``/space separators), and communicator ids such as ``"tp-0"``,
    ``"pp-3"``, ``"edp-1"`` (edp -> dp, etp -> tp).

    Examples
    --------
    >>> kind_from_group_name("DATA_PARALLEL_GROUP_WITH_CP"), kind_from_group_name("pp-3")
    ('dp', 'pp')
    >>> kind_from_group_name("Tensor Parallel"), kind_from_group_name("MODEL_PARALLEL_GROUP")
    ('tp', 'other')
    """
    if not isinstance(name, str):
        return "other"
    norm = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")
    upper = norm.upper()
    if upper.endswith("_GLOO"):
        upper = upper[: -len("_GLOO")]
    if upper in _EXACT_KIND:
        return _EXACT_KIND[upper]
    if upper in _EXACT_OTHER:
        return "other"
    if re.fullmatch(r"HIERARCHICAL_CONTEXT_PARALLEL_GROUP(_L\d+)?", upper):
        return "cp"
    m = re.fullmatch(r"([a-z]+(?:_[a-z]+)*?)(?:_\d+)+", norm)  # communicator ids like tp-0-1
    if m and m.group(1) in _ALIASES:
        return _ALIASES[m.group(1)]
    stem = norm
    changed = True
    while changed:
        changed = False
        for suf in _SUFFIXES:
            if stem.endswith(suf) and len(stem) > len(suf):
                stem = stem[: -len(suf)]
                changed = True
    return _ALIASES.get(stem, "other")


# ---------------------------------------------------------------------- inference

# observed group kind -> product of unknowns it measures
_PRODUCTS = {
    "tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "dp_cp": ("dp", "cp"), "pp": ("pp",),
    "mp": ("tp", "pp"), "tp_cp": ("tp", "cp"), "tp_dp": ("tp", "dp"),
    "tp_dp_cp": ("tp", "dp", "cp"), "ep": ("ep",), "etp": ("etp",), "edp": ("edp",),
    "etp_ep": ("etp", "ep"), "etp_ep_pp": ("etp", "ep", "pp"),
}
_DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def _observed_kind(name: str, desc: str) -> str | None:
    """Layout group kind a named group measures, or None if it carries no layout information."""
    key = desc.strip().upper()
    if key.endswith("_GLOO"):
        key = key[: -len("_GLOO")]
    if key in MEGATRON_GROUP_KINDS:
        kind = MEGATRON_GROUP_KINDS[key]
        return kind if kind in _PRODUCTS else None
    if any(w in key for w in ("PARTIAL", "HIERARCHICAL", "HYBRID", "_AG")):
        return None  # sub-groups or duplicates of a dimension: no layout information
    for text in (desc, name):
        m = re.fullmatch(r"\s*(edp|etp|dp_cp)[-_]\d+.*", text.lower())
        if m:
            return m.group(1)
    kind = kind_from_group_name(desc)
    if kind == "other":
        return None
    return "dp_cp" if kind == "dp" else kind


def _parse_ranks(name: str, ranks: object) -> tuple[int, ...]:
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except ValueError as exc:
            raise LayoutError(f"group {name!r}: ranks {ranks!r} are not a list") from exc
    try:
        out = tuple(sorted(int(r) for r in ranks))  # type: ignore[union-attr]
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"group {name!r}: ranks {ranks!r} are not integers") from exc
    return out


def _solve_degrees(sizes: dict[str, int], world: int) -> dict[str, int]:
    eqs = [(_PRODUCTS[k], v) for k, v in sizes.items()]
    eqs.append((("tp", "cp", "dp", "pp"), world))
    eqs.append((("etp", "ep", "edp", "pp"), world))
    known: dict[str, int] = {}
    defaults = [("cp", lambda: 1), ("ep", lambda: 1), ("pp", lambda: 1), ("tp", lambda: 1),
                ("etp", lambda: known["tp"])]

    def propagate() -> None:
        changed = True
        while changed:
            changed = False
            for vars_, value in eqs:
                unknown = [v for v in vars_ if v not in known]
                prod = int(np.prod([known[v] for v in vars_ if v in known]))
                if not unknown:
                    if prod != value:
                        raise LayoutError(
                            f"observed groups are inconsistent: {'*'.join(vars_)} = {prod} "
                            f"from other groups but {value} observed"
                        )
                elif len(unknown) == 1:
                    if value % prod:
                        raise LayoutError(
                            f"observed groups are inconsistent: {'*'.join(vars_)} = {value} "
                            f"is not divisible by {prod}"
                        )
                    known[unknown[0]] = value // prod
                    changed = True

    propagate()
    for var, default in defaults:
        if var not in known:
            known[var] = default()
            propagate()
    return known


def _candidate_orders() -> list[str]:
    first = [_DEFAULT_ORDER, "tp-cp-ep-pp-dp"]
    rest = sorted("-".join(p) for p in itertools.permutations(_TOKENS))
    return first + [o for o in rest if o not in first]


def infer_layout(
    groups: Mapping[str, tuple[str, Sequence[int]]], world_size: int
) -> ParallelLayout:
    """Infer the :class:`ParallelLayout` that produced a set of named process groups.

    Parameters
    ----------
    groups : mapping
        Group name -> ``(description, ranks)``. Descriptions are Megatron ``group_desc`` values
        (see :data:`MEGATRON_GROUP_KINDS`) or anything :func:`kind_from_group_name` understands
        (a generic ``dp`` group is taken as DATA_PARALLEL_GROUP_WITH_CP). ``ranks`` may be a
        sequence of ints or its JSON text (as in Flight Recorder ``pg_config``). Groups that
        carry no layout information (default_pg, unknown names) are ignored; the groups may be
        a subset of all groups (e.g. only those some ranks belong to).
    world_size : int
        Number of ranks.

    Returns
    -------
    ParallelLayout
        Degrees solved from the group sizes (unobserved dimensions default to 1, etp to tp) and
        the first order, Megatron's default ``tp-cp-ep-dp-pp`` tried first, under which every
        observed group is generated.

    Raises
    ------
    LayoutError
        If group sizes are inconsistent or no order reproduces the groups.

    Examples
    --------
    >>> obs = {"a": ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1]),
    ...        "b": ("PIPELINE_MODEL_PARALLEL_GROUP", "[0, 4]"),
    ...        "c": ("DATA_PARALLEL_GROUP", [0, 2])}
    >>> infer_layout(obs, 8)
    ParallelLayout(tp=2, pp=2, dp=2, cp=1, ep=1, etp=None, order='tp-cp-ep-dp-pp')
    """
    world = _check_degree("world_size", world_size)
    observed: dict[str, set[tuple[int, ...]]] = {}
    for name, item in groups.items():
        try:
            desc, ranks = item
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"group {name!r}: expected (description, ranks)") from exc
        kind = _observed_kind(str(name), str(desc))
        if kind is None:
            continue
        members = _parse_ranks(str(name), ranks)
        if not members or members[0] < 0 or members[-1] >= world:
            raise LayoutError(f"group {name!r} ({desc}): ranks {list(members)} outside world_size {world}")
        observed.setdefault(kind, set()).add(members)
    sizes: dict[str, int] = {}
    for kind, gs in observed.items():
        lens = {len(g) for g in gs}
        if len(lens) != 1:
            raise LayoutError(f"groups of kind {kind!r} have different sizes {sorted(lens)}")
        sizes[kind] = lens.pop()
    deg = _solve_degrees(sizes, world)
    etp = None if deg["etp"] == deg["tp"] else deg["etp"]
    seen: set[tuple] = set()
    for order in _candidate_orders():
        toks = order.split("-")
        dense = {"tp": deg["tp"], "cp": deg["cp"], "dp": deg["dp"], "pp": deg["pp"], "ep": 1}
        expert = {"tp": deg["etp"], "cp": 1, "ep": deg["ep"], "dp": deg["edp"], "pp": deg["pp"]}
        key = (tuple(t for t in toks if dense[t] > 1), tuple(t for t in toks if expert[t] > 1))
        if key in seen:
            continue
        seen.add(key)
        try:
            lay = ParallelLayout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"], cp=deg["cp"],
                                 ep=deg["ep"], etp=etp, order=order)
        except LayoutError:
            continue
        if all(gs <= set(lay.groups(kind)) for kind, gs in observed.items()):
            logger.debug("inferred layout %s from %d groups", lay, len(groups))
            return lay
    raise LayoutError(
        f"no rank order reproduces the observed groups with degrees tp={deg['tp']}, "
        f"cp={deg['cp']}, dp={deg['dp']}, pp={deg['pp']}, ep={deg['ep']}, etp={deg['etp']}"
    )
