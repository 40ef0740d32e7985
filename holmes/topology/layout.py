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

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from holmes.errors import LayoutError

__all__ = [
    "KINDS",
    "GROUP_KINDS",
    "MEGATRON_GROUP_KINDS",
    "Communicator",
    "ParallelLayout",
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

    @classmethod
    def _trusted(cls, kind: str, ranks: tuple[int, ...]) -> Communicator:
        """Build without validation (ranks known sorted and distinct)."""
        obj = object.__new__(cls)
        obj.__dict__.update(kind=kind, ranks=ranks)
        return obj


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
                arr = pp[:, cols]
            else:
                arr = self._array(kind)
            out = list(map(tuple, arr.tolist()))
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
        make = Communicator._trusted
        for kind in kinds:
            arr = self._array(_COMM_GROUP[kind])
            if arr.shape[1] < 2:
                continue
            ckind = "dp" if kind == "edp" else kind
            for i, row in enumerate(self.groups(_COMM_GROUP[kind])):
                out[f"{kind}-{i}"] = make(ckind, row)
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
