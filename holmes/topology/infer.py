"""Process-group names -> communicator kinds, and inference of a :class:`ParallelLayout` from
observed process groups (e.g. a Flight Recorder ``pg_config``).

Both functions are also importable from :mod:`holmes.topology`.

Examples
--------
>>> kind_from_group_name("EXPERT_MODEL_PARALLEL_GROUP")
'ep'
>>> infer_layout({"g": ("TENSOR_MODEL_PARALLEL_GROUP", "[0, 1]")}, 4).tp
2
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Mapping, Sequence

import numpy as np

from holmes.errors import LayoutError
from holmes.topology.layout import MEGATRON_GROUP_KINDS, ParallelLayout, _check_degree

__all__ = ["kind_from_group_name", "infer_layout"]

logger = logging.getLogger(__name__)

_TOKENS = ("tp", "cp", "ep", "dp", "pp")


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
    defaults = [("cp", 1), ("ep", 1), ("pp", 1), ("tp", 1)]

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
            known[var] = default
            propagate()
    return known  # etp / edp stay unknown when no expert group pins them


def _etp_candidates(deg: dict[str, int]) -> list[int]:
    if "etp" in deg:
        return [deg["etp"]]
    inner = deg["tp"] * deg["cp"] * deg["dp"]
    if inner % deg["ep"]:
        raise LayoutError(f"ep={deg['ep']} does not divide tp*cp*dp = {inner}")
    room = inner // deg["ep"]
    divs = [d for d in range(room, 0, -1) if room % d == 0]
    first = [deg["tp"]] if deg["tp"] in divs else []
    return first + [d for d in divs if d != deg["tp"]]


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
    seen: set[tuple] = set()
    for etp_value, order in itertools.product(_etp_candidates(deg), _candidate_orders()):
        toks = order.split("-")
        dense = {"tp": deg["tp"], "cp": deg["cp"], "dp": deg["dp"], "pp": deg["pp"], "ep": 1}
        edp = deg["tp"] * deg["cp"] * deg["dp"] // (etp_value * deg["ep"])
        expert = {"tp": etp_value, "cp": 1, "ep": deg["ep"], "dp": edp, "pp": deg["pp"]}
        key = (etp_value, tuple(t for t in toks if dense[t] > 1),
               tuple(t for t in toks if expert[t] > 1))
        if key in seen:
            continue
        seen.add(key)
        try:
            lay = ParallelLayout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"], cp=deg["cp"],
                                 ep=deg["ep"], etp=None if etp_value == deg["tp"] else etp_value,
                                 order=order)
        except LayoutError:
            continue
        if all(gs <= set(lay.groups(kind)) for kind, gs in observed.items()):
            logger.debug("inferred layout %s from %d groups", lay, len(groups))
            return lay
    raise LayoutError(
        f"no rank order reproduces the observed groups with degrees tp={deg['tp']}, "
        f"cp={deg['cp']}, dp={deg['dp']}, pp={deg['pp']}, ep={deg['ep']}"
        + (f", etp={deg['etp']}" if "etp" in deg else "")
    )
