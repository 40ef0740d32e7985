"""The thresholds of the analyses: one frozen, typed object read from a versioned JSON file.

Every numeric rule of :mod:`holmes.localize` (a z value, a ratio, a floor, a slack in
nanoseconds, a minimum sample size) reads its value from a :class:`Thresholds` object, never
from a literal. The values live in ``thresholds.json`` beside this module::

    {"schema": "holmes.thresholds/1", "thresholds": {"stretch_z": 5.0, ...}}

written by ``scripts/tune.py`` from the development splits; this module declares each name's
type, bounds and meaning (``docs/thresholds.md`` lists them) and validates a file at the edge:
an unknown name, a missing one or a wrong type raises :class:`~holmes.errors.ThresholdsError`
naming the file and the key.

:func:`load_thresholds` reads a file once per path (the parsed object is immutable, so the
cache holds no state a caller can change); :meth:`Thresholds.replace` gives a validated copy
with some values overridden. :class:`~holmes.localize.LocalizeParams` carries one, read by the
analyses as ``params.t.<name>``.

This package is a low floor: it imports nothing from :mod:`holmes.localize`.

Examples
--------
>>> t = load_thresholds()
>>> t is load_thresholds()
True
>>> t.replace(stretch_z=6).stretch_z, t.stretch_z == t.replace(stretch_z=6).stretch_z
(6.0, False)
>>> t.replace(strech_z=6)
Traceback (most recent call last):
...
holmes.errors.ThresholdsError: thresholds (overrides): unknown threshold 'strech_z'
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from holmes.errors import ThresholdsError
from holmes.limits import read_json_capped

__all__ = ["SCHEMA", "DEFAULT_PATH", "Thresholds", "load_thresholds", "or_shipped", "threshold_names", "docs_markdown"]

#: the version tag a thresholds file carries
SCHEMA = "holmes.thresholds/1"
#: the file shipped with the package (written by ``scripts/tune.py``)
DEFAULT_PATH = Path(__file__).with_name("thresholds.json")

# value kinds: every float is finite; counts are plain integers
Num = Annotated[float, Field(allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Frac = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]
PosCount = Annotated[int, Field(ge=1)]


def _doc(text: str) -> Any:
    return Field(description=" ".join(text.split()))


class Thresholds(BaseModel):
    """Every threshold of the analyses (names, types and meanings; the values come from a file).

    Build one with :func:`load_thresholds`; :meth:`replace` overrides some values. Attribute
    access (``t.stretch_z``) is all the analyses need.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # ---- the defaults of LocalizeParams's knobs whose values are fitted ---------------------------
    default_min_confidence: Frac = _doc(
        "Default of LocalizeParams.min_confidence: a device is named only when its confidence reaches this; "
        "otherwise the verdict is inconclusive and the devices are candidates.")
    default_full_read: Count = _doc(
        "Default of LocalizeParams.full_read: jobs of at most this many ranks are read whole and compared "
        "cell by cell (holmes.localize.cells); larger jobs run Algorithm 1 from the pivot.")
    default_probe_reads: Count = _doc(
        "Default of LocalizeParams.probe_reads: extra ranks the network probes may read (0 turns them off).")
    default_host_reads: Count = _doc(
        "Default of LocalizeParams.host_reads: extra ranks the host probe may read to tell a slow GPU from a "
        "slow host (0 turns it off).")
    default_scan_reads: Count = _doc(
        "Default of LocalizeParams.scan_reads: ranks not read before that the search's scan of one "
        "collective group may read before it is set aside (0: every scan runs in full at once).")
    # ---- Algorithm 1: the search (holmes.localize.search, explain, probe, host_probe) ------------
    max_starts: PosCount | None = _doc(
        "Start operators per monitored rank and iteration: the abnormal ones that lasted longest beyond "
        "their usual duration, searched in start order (null: every one).")
    late_ratio: Frac = _doc(
        "A member's copy lasting at most this fraction of the searched operator marks it as the late "
        "arriver even when the detector flagged it (0 trusts the detector alone).")
    follow_waits: bool = _doc(
        "A late rank that lost more time waiting in its operators of the iteration than computing passes "
        "the blame on through its latest abnormal operator even when its last compute gap grew more.")
    include_host: bool = _doc(
        "Compute causes also implicate the host (explained away by its most-blamed GPU).")
    exonerate: bool = _doc(
        "Leave out of a network cause the devices crossed quickly, in the same iteration, by operators "
        "that ran normally (holmes.localize.healthy).")
    exonerate_bytes: NonNeg = _doc(
        "Only operators moving at least this share of the cause operator's bytes clear a device.")
    exonerate_speedup: NonNeg = _doc(
        "... and only those at least this many times as fast as the cause operator.")
    rate_lag: Count = _doc(
        "The irregularity rate R is the best Pearson correlation over lags 0 .. rate_lag.")
    narrow: bool = _doc(
        "Narrow each network cause to its devices the other network causes implicate most.")
    # ---- which iterations are searched (holmes.localize.iteration_rules, confidence) --------------
    noise_z: NonNeg = _doc(
        "An irregular iteration counts by how far it stands above the job's healthy spread: not at all "
        "within noise_z - 1 healthy sigmas, fully beyond noise_z + 1; iterations within the noise are not "
        "searched.")
    noise_window: Count = _doc(
        "The healthy level an iteration is weighed against is also taken locally, over the 2 * noise_window "
        "+ 1 iterations around it (a slow drift of the whole job is not an irregularity); 0: window-wide only.")
    noise_mad_floor: bool = _doc(
        "Algorithm 1: an irregular iteration's distance from the job's noise (its weight, see noise_z) is "
        "also measured in the window's MAD sigmas, as the stretch rules measure it: on a few dozen "
        "iterations the fast side alone can be a fraction of the job's spread (a healthy 256-GPU job's "
        "1.10x step stood 7.5 fast-side sigmas out and 2.1 MAD sigmas). False: the fast side alone.")
    null_iterations: Count = _doc(
        "Regular iterations the search also runs on (evenly spread over the window): how often the "
        "procedure blames a device when nothing is wrong sets the chance level its evidence must beat; "
        "0 uses the topology's share alone.")
    straggler_share: NonNeg = _doc(
        "A rank whose own compute grew in an irregular iteration by at least this share of the iteration's "
        "excess, and by at least half as much as the rank that grew most, is a compute straggler of it; "
        "stragglers on several hosts are a common-mode slowdown no device explains; 0 turns the rule off.")
    stretch_z: NonNeg = _doc(
        "An iteration under delta is irregular too when it lasts at least 1 + min_stretch times the usual "
        "one and stands stretch_z of the job's own healthy sigmas above it (not next to a delta-irregular "
        "iteration). Not on jobs read whole; 0 keeps the paper's delta rule alone and turns candidate_z off. "
        "4 names single NVSwitch and spine-link spikes costing 4-7% on the simulated development splits but "
        "leaves a healthy 2,048-GPU job inconclusive one time in four: 5.")
    min_stretch: NonNeg = _doc(
        "See stretch_z: the smallest stretch it flags, as a share of the usual iteration.")
    candidate_z: NonNeg = _doc(
        "Iterations standing candidate_z to stretch_z healthy sigmas out (at least min_stretch longer) are "
        "candidates, searched: a cause of one counts only when its rank's own work stood own_z sigmas out "
        "of that rank's usual level; a candidate no cause explains is the job's noise. 0 turns them off.")
    own_z: NonNeg = _doc(
        "See candidate_z. On the simulated development splits every cause of a 3.5-5-sigma iteration "
        "implicating no faulty device stood at most 3.2 sigmas out of its rank's noise; every faulty "
        "iteration kept a cause at 5 or more.")
    compute_z: NonNeg = _doc(
        "Algorithm 1: a compute cause counts only when its rank computed compute_z robust sigmas longer in "
        "its iteration than over the usual ones (holmes.localize.cause_filter.computed_longer); faulty "
        "GPUs/hosts stood 17 sigmas out or more on the development splits, a network fault's healthy last "
        "arriver 1.8-3.6. 0 keeps every compute cause.")
    repeat_z: NonNeg = _doc(
        "When no iteration is irregular, the iterations standing repeat_z healthy sigmas out and at least "
        "min_stretch longer -- if two or more -- are searched, and a device counts only when it explains "
        "two of them (a fault that returns). Not on jobs read whole; 0 turns the rule off.")
    cause_share: Frac = _doc(
        "Algorithm 1: a root cause counts only when it cost its rank in its iteration at least this share "
        "of the iteration's excess over the usual one (holmes.localize.cause_filter.drop_minor). 0 keeps "
        "every cause.")
    shift_z: NonNeg = _doc(
        "Iterations after a step up of the pivot's iterations that lasts to the end of the window are "
        "irregular too when the step stands shift_z standard errors out and is at least min_shift of the "
        "step (healthy 2,048-GPU jobs stayed at most 3.1; a leaf switch slow from iteration 14 on stood "
        "4.6). Not on jobs read whole; 0 turns it off.")
    min_shift: NonNeg = _doc(
        "See shift_z: the smallest step it flags, as a share of the usual iteration.")
    # ---- jobs read whole: cells (holmes.localize.cells, tails, transfer) ---------------------------
    cell_noise: NonNeg = _doc(
        "Jobs of at most full_read ranks are compared cell by cell only when the job's compute noise (the "
        "pooled spread of the ranks' compute per iteration, or the median rank's own spread around its "
        "usual level where smaller, over the usual compute) is at most this; a noisier job runs "
        "Algorithm 1 from the pivot instead. The comparison judges every cell against "
        "the job's own noise, so only a job whose compute is mostly noise is refused: on the three real "
        "corpora (205 runs) 4 jobs lie above 0.1 (at most 0.12) and read the same either way, while "
        "DDP's few ms of compute between its gradient buckets reach 0.6 (Algorithm 1 was unsure there).")
    collective_end_slack_ns: NonNeg = _doc(
        "Jobs read whole: a copy of an all-reduce, all-gather, reduce-scatter, all-to-all or barrier "
        "still open when its rank issued its next operator (asynchronous), ending more than "
        "collective_end_slack_ns after its host's first copy of the same operator, is read as ending with"
        " that one (the members complete together: the later end was observed late, e.g. gloo's "
        "completion callback waiting for the GIL of a busy rank) (nanoseconds).")
    cell_usual_q: Annotated[float, Field(gt=0, lt=0.5)] = _doc(
        "Jobs read whole: a row's usual level is this quantile of its iterations, so a slowdown covering "
        "up to 1 - cell_usual_q of them is measured against the healthy level.")
    cell_cost: NonNeg = _doc(
        "Jobs read whole: outside the pivot's delta-irregular iterations a cell counts only when its excess "
        "reaches cell_cost * (delta - 1) times the usual iteration (1: it alone could make an iteration "
        "irregular; 0: any cell beyond the noise counts).")
    cell_cost_z: NonNeg = _doc(
        "Jobs read whole: on a quiet job the cost a cell needs is lower, cell_cost_z sigmas of the pivot's "
        "iterations, at least min_stretch of the step, when that is under cell_cost's; 0 keeps cell_cost "
        "alone.")
    cell_transient: Frac = _doc(
        "Jobs read whole: an event that is one operator's stall -- the device's other work grew at under "
        "this fraction of that operator's rate -- is reported as a one-off stall, not counted as evidence "
        "against the device; 0 counts every cell.")
    warmup_iterations: Count = _doc(
        "The first iterations of a job's log are its warm-up (communicators connected, allocators and "
        "kernels' first runs, data loader filling): not searched, their cells not compared. On the real "
        "corpora (205 runs) the pivot's iteration 0 is over 1.1x its median in 16-47% of runs, iteration 1 "
        "in 3-31%, iterations 2-4 in 3-19%; 3 of the 15 significant events of the healthy runs fell in "
        "iteration 1. 0 searches every iteration.")
    cell_event_p: Annotated[float, Field(gt=0, le=1)] = _doc(
        "Jobs read whole: a cell makes an event of its iteration when its p-value, times the rows of its "
        "kind (ranks, channels), is below this.")
    cell_tail: Literal["exponential", "gpd"] = _doc(
        "Jobs read whole: the model of the null cells' upper tail (holmes.localize.tails.tail_pvalue).")
    cell_per_op: bool = _doc(
        "Jobs read whole: a channel's cell in an iteration is the median of its operators' slowdowns "
        "instead of its summed transfer time.")
    tail_calibration: Annotated[float, Field(ge=1, allow_inf_nan=False)] = _doc(
        "Jobs read whole: a shared device's (host, NVSwitch, switch, uplink) confidence is 1 - "
        "tail_calibration * p, p the family-wise p-value of its cells; on 104 development real runs a "
        "healthy run's strongest shared device had p >= 8e-5.")
    point_calibration: Annotated[float, Field(ge=1, allow_inf_nan=False)] = _doc(
        "Jobs read whole: tail_calibration for single devices (a GPU, a NIC, a NIC's cable); the strongest "
        "single device of a healthy development run had p = 2e-4.")
    # ---- the persistent analysis (holmes.localize.persistent*) ------------------------------------
    persistent_z: Pos = _doc(
        "A rank's median excess work over its work peers' must stand this many standard errors above zero, "
        "a channel's median excess transfer time this many times its class's iteration-to-iteration noise.")
    persistent_fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = _doc(
        "... and a straggler only when it is an outlier in at least this share of the window.")
    network_min_excess: NonNeg = _doc(
        "A communicator's transfers count as slow only when also at least this much (relative) slower than "
        "its peers'.")
    imbalance_pct: NonNeg = _doc(
        "When no device is named and the what-if slowdown is at least this many percent, the persistent "
        "analysis names the non-device cause (pipeline-stage or micro-batch imbalance).")
    persistent_min_effect: NonNeg = _doc(
        "A rank's work must exceed its work peers' by at least this much (relative) over the window to be "
        "a straggler (healthy real runs stayed under 0.077 on the development splits, slow GPUs at 1.14x "
        "stood at 0.157).")
    unexplained_slowdown: Annotated[float, Field(ge=1, allow_inf_nan=False)] = _doc(
        "A job whose what-if step is at least this many times its ideal while no device is named is "
        "inconclusive, never healthy (healthy development runs reached 1.228).")

    # ---- Algorithm 1: which causes count (holmes.localize.cause_filter) ----------------------------------
    cause_min_iterations: PosCount = _doc(
        "A cause's cost and how far it stood out are judged against its rank's usual iterations only "
        "when there are at least this many (else: its operator's own excess; NaN, nothing to judge "
        "against).")
    diffuse_dominance: NonNeg = _doc(
        "An iteration whose causes fall into unrelated groups keeps the group whose strongest cause cost "
        "the iteration at least this many times the next group's; otherwise it is diffuse, a job-wide "
        "disturbance (holmes.localize.cause_filter.drop_diffuse).")

    # ---- Algorithm 1: stragglers and slow channels (holmes.localize.straggler, transfer, explain) --------
    pivot_compute_share: Frac = _doc(
        "The pivot is its own straggler when the growth of its own compute gaps in an iteration accounts "
        "for at least this share of the iteration's excess (holmes.localize.explain.pivot_compute).")
    straggler_ratio: Frac = _doc(
        "A rank grew in an iteration (holmes.localize.straggler.classify) when its compute growth is at "
        "least this fraction of the largest growth ...")
    straggler_z: NonNeg = _doc(
        "... and at least this many of its own healthy spreads (the (q25 - q05) normal sigma of its "
        "compute per iteration).")
    straggler_min_iterations: PosCount = _doc(
        "A rank's compute growth is judged only when it has at least this many iterations.")
    channel_share: Frac = _doc(
        "A channel (one communicator's collectives, one direction of a P2P pair) is slow in an iteration "
        "when its transfers' excess is at least this share of the iteration's excess ...")
    channel_z: NonNeg = _doc(
        "... and at least this many of its own healthy spreads (holmes.localize.transfer.pick_channels).")
    channel_dominance: NonNeg = _doc(
        "The slowest channel is the network's answer unless an unrelated slow channel comes within this "
        "factor of it (then unrelated channels slowed together: common mode).")
    channel_min_iterations: PosCount = _doc(
        "A channel's transfer excess is judged only when it was seen in at least this many iterations.")

    # ---- jobs read whole: the null cells' tail (holmes.localize.tails) -----------------------------------
    tail_q: Frac = _doc(
        "The tail of the null cells is fitted above this quantile of them (the exponential tail's "
        "threshold; the generalized Pareto's too).")
    tail_body_q: Frac = _doc(
        "The exponential tail's scale is the mean excess of the cells up to this quantile (a few extreme "
        "cells, the faults, weigh nothing in it).")
    tail_min_cells: PosCount = _doc(
        "Fewer finite null cells than this fit no tail (nothing is significant).")
    tail_predictive_cells: Count = _doc(
        "A transfer or compute cell is judged by the predictive tail (its scale's own uncertainty) when "
        "the exponential scale of its null averaged fewer cells than this (0: never): a 4-rank "
        "pipeline's P2P channels are judged against 2 channels x 15 steps, whose scale rests on 2 "
        "cells; a 2-rank pipeline's stage against the other stage's 29 cells, on 3.")
    tail_min_scale: Pos = _doc(
        "The smallest scale of a fitted tail (in the cells' z units).")
    gpd_max_shape: NonNeg = _doc(
        "The generalized Pareto shape is clipped to [0, gpd_max_shape] (0: the exponential tail).")
    gpd_min_excesses: PosCount = _doc(
        "Fewer excesses over tail_q than this: the generalized Pareto tail is the exponential one at "
        "tail_min_scale.")

    # ---- Algorithm 1: confidence and the host probe (holmes.localize.confidence, host_probe) -------------
    opportunity_max_groups: PosCount = _doc(
        "The network opportunity of a device (the share of the job's transfer groups whose paths cross "
        "it) is measured over at most this many groups, drawn evenly with a seeded generator.")
    null_prior_weight: NonNeg = _doc(
        "A device's chance level is its opportunity updated by the job's own null searches: (null_hits + "
        "null_prior_weight * opportunity) / (null_n + null_prior_weight).")
    host_probe_mates: PosCount = _doc(
        "Host-mates the host probe checks per compute cause.")
    host_probe_ratio: Frac = _doc(
        "A host-mate corroborates a slow host when its compute excess reaches this fraction of the "
        "straggler's; the host is implicated when half the mates checked corroborate.")

    # ---- Algorithm 1: the network probes (holmes.localize.probe) -----------------------------------------
    probe_slow_ratio: Pos = _doc(
        "A copy that timed a transfer is slow when flagged abnormal, or when it lasted at least this "
        "many times its healthy reference (a persistent slowdown is the norm of a detector's window, not "
        "of the healthy reference).")
    probe_max_group: PosCount = _doc(
        "The largest collective group a network probe reads in full (larger ones only when already "
        "fetched).")
    probe_per_cause: Count = _doc(
        "Reads one network cause's probes may always spend ...")
    probe_cause_share: Frac = _doc(
        "... beyond that a cause spends at most this share of what is left of probe_reads, so the causes "
        "of later iterations are probed too.")
    probe_leaf_pairs: PosCount = _doc(
        "P2P pairs of other GPUs below a suspected leaf switch (one pair per GPU) a probe asks.")
    probe_ring_groups: PosCount = _doc(
        "Collectives whose ring uses a suspected cable that a probe asks for a copy at its healthy "
        "duration (one clears the cable).")

    # ---- the hang analysis (holmes.localize.hang) --------------------------------------------------------
    hang_conf_culprit: Frac = _doc(
        "Confidence of a hang's root that has its own log (idle, or stalled after its last operator).")
    hang_conf_no_log: Frac = _doc(
        "Confidence of a hang's root with no log at all.")
    hang_conf_cycle: Frac = _doc(
        "Confidence of a rank stuck inside an operator every participant entered (which of them cannot "
        "be told).")
    hang_conf_deadlock: Frac = _doc(
        "Confidence of each rank of a wait cycle (a deadlock).")

    # ---- device ranking (holmes.localize.ranking) --------------------------------------------------------
    rate_min_points: PosCount = _doc(
        "The irregularity rate (a Pearson correlation of an operator's series with the iteration times) "
        "needs at least this many common iterations; fewer give 0.")
    prior_gpu: Frac = _doc(
        "p(d) of a GPU: Table 1 of the paper (share of faults by device kind); LocalizeParams.prior "
        "overrides per run.")
    prior_nic: Frac = _doc(
        "p(d) of a NIC (Table 1 of the paper).")
    prior_link: Frac = _doc(
        "p(d) of a link (Table 1 of the paper).")
    prior_switch: Frac = _doc(
        "p(d) of a switch (Table 1 of the paper).")
    prior_cpu: Frac = _doc(
        "p(d) of a host's CPU (Table 1 of the paper).")
    prior_other: Frac = _doc(
        "p(d) of any other device, NVSwitches included (Table 1 of the paper).")

    # ---- which iterations are searched (holmes.localize.iteration_rules) ---------------------------------
    stretch_min_iterations: PosCount = _doc(
        "The stretch, candidate and repeat rules judge a window only when it holds at least this many "
        "iterations (fewer: the delta rule alone).")

    # ---- the persistent analysis: what-if and confidence (holmes.localize.persistent) --------------------
    whatif_iterations: PosCount = _doc(
        "The what-if replays run on at most this many iterations of the window, evenly spaced (the mean "
        "step over 32 iterations is within the iteration noise of the whole window's, at a third of the "
        "cost for a 100-iteration window).")
    whatif_max_replicas: Count = _doc(
        "The per-replica what-if decomposition runs only on jobs of at most this many data-parallel "
        "replicas (one replay each).")
    whatif_max_groups: PosCount = _doc(
        "The per-stage / per-replica decomposition runs only with at most this many groups ...")
    whatif_max_ranks: PosCount = _doc(
        "... and at most this many ranks.")
    whatif_max_suspects: Count = _doc(
        "A suspect's what-if impact is replayed for at most this many suspects (the first ones).")
    persistent_max_chance: Frac = _doc(
        "The chance level of a persistent suspect's outlier iterations (compute: the job's outlier rate; "
        "network: its flag rate) is at most this.")
    persistent_min_network_chance: Frac = _doc(
        "The chance level of a network suspect's flagged iterations is at least this.")
    persistent_ambiguous_conf: Frac = _doc(
        "A host that is exactly one heavier pipeline stage's GPUs (a slow host and a heavier stage "
        "cannot be told apart) has at most this confidence.")
    stage_volume_tolerance: Frac = _doc(
        "The first or last pipeline stage is heavier by design only when its gradient reduction volume "
        "(its layers' parameters) differs from the other stages' by more than this share; with equal "
        "volumes a host that is exactly that stage's GPUs is named, not called ambiguous.")
    imbalance_stage_share: Frac = _doc(
        "A pipeline-stage imbalance is named when the slowest stage alone accounts for at least this "
        "share of the job's what-if slowdown (and is slowest on every replica, by at least imbalance_pct "
        "/ 2 percent).")
    microbatch_moving_share: Frac = _doc(
        "A micro-batch imbalance is named when the slow position moves between replicas in at least this "
        "share of the iterations with an outlier.")

    # ---- the persistent analysis: summaries, suspects (holmes.localize.persistent_rank, persistent_wait, persistent_suspects) ---
    default_persistent_window: PosCount = _doc(
        "The iterations persistent_window() keeps when no window is given (the map-reduce helpers; "
        "holmes.localize passes LocalizeParams.window).")
    persistent_starts_max_world: Count = _doc(
        "Jobs of at most this many ranks take each rank's iteration starts from the job's iteration "
        "table when summarizing it (larger: from the operators alone).")
    wait_ratio: Pos = _doc(
        "A rank waited in an operator when it lasted more than wait_ratio times the shortest copy of its "
        "operator position plus wait_slack_ns; its own work since it last waited accumulates until then.")
    wait_slack_ns: NonNeg = _doc(
        "See wait_ratio (nanoseconds).")
    batch_issue_ns: NonNeg = _doc(
        "An operator a rank issued while its previous one was still in flight starts a batch of its own "
        "when it came more than batch_issue_ns after that one's start and that one ran on past it by more "
        "than batch_issue_ns: the rank computed in between and the earlier operator ran detached (an async "
        "isend, a DDP bucket); else it joins that one's batch (issued together, e.g. batched send/recv) "
        "(nanoseconds).")
    slot_bins_per_octave: PosCount = _doc(
        "Message sizes are told apart to 1 / slot_bins_per_octave of a factor of two (operator types, "
        "peer slot classes).")
    dense_lookup_max: PosCount = _doc(
        "Operator types are numbered by a dense look-up table when it has at most this many entries "
        "(else by a sort; the same numbers).")
    persistent_work_floor: Frac = _doc(
        "A rank's work per iteration counts as at least this share of the step before its log is taken.")
    persistent_min_sigma: Pos = _doc(
        "The floor of a work peer group's (or the stages') iteration-to-iteration noise, in log units.")
    persistent_gap_share: NonNeg = _doc(
        "A straggler stands apart from its group: above the widest gap, of at least this share of the "
        "log of 1 + persistent_min_effect, between the sorted excesses.")
    network_min_sigma: Pos = _doc(
        "The floor of a slot class's iteration-to-iteration noise, in log units.")
    network_hit_share: Frac = _doc(
        "An iteration is a hit of a network device when at least this share of the slots crossing it are "
        "flagged slow (or every persistently slow slot it explains is: one slow P2P direction).")
    network_candidate_share: Frac = _doc(
        "Network devices scoring at least this share of the best device's score are persistent suspects.")

    # ---- Algorithm 1: the window (holmes.localize.irregular) ---------------------------------------------
    rate_min_iterations: PosCount = _doc(
        "A window of fewer iterations than this is analysed with an assumption: its irregularity rates "
        "are unreliable.")

    # ---- jobs read whole: the cells (holmes.localize.cells) ----------------------------------------------
    cell_common_q: Frac = _doc(
        "Jobs read whole: the common mode of an iteration's compute is this quantile over the ranks (a "
        "loaded machine slows everyone; a low quantile, so a slow host of half the job does not enter "
        "it).")
    cell_transfer_common_q: Frac = _doc(
        "Jobs read whole: the common mode of an iteration's transfer z-scores is this quantile over the "
        "channels.")
    cell_min_noise: NonNeg = _doc(
        "Jobs read whole: the pooled compute spread is at least this share of the median rank's usual "
        "compute.")
    cell_min_transfer_spread: NonNeg = _doc(
        "Jobs read whole: a channel's spread is at least this share of its usual transfer (of its "
        "operators' usual slowdown ratio, with cell_per_op).")
    cell_join_ratio: Frac = _doc(
        "Jobs read whole: significant cells within this ratio of the strongest one's z join its event "
        "(the other ranks of a slow host, the other channels of a slow NIC).")
    cell_hot_z: NonNeg = _doc(
        "Jobs read whole: a channel crossing a candidate device counts as slower than usual in the "
        "iteration at this z; candidates are ordered by the share of such channels. A compute cell at "
        "this z shaped as a one-off stall (cell_transient) is left out of the null an evenly slower GPU "
        "is judged against.")
    transient_min_ops: PosCount = _doc(
        "A one-off stall is told from a slower device by how the device's other operators grew; with "
        "fewer operators than this it cannot be told (NaN).")
    transient_recur_p: Frac = _doc(
        "A one-off stall is one-off only once: when one GPU or host stands out (a compute event, one-off "
        "stall or not) in more iterations than chance allows -- the chance that any of the job's ranks "
        "(hosts) holds as many of the job's compute events, were they spread at random, at most this -- "
        "its stalls count as evidence (a rank stalling its forward every few steps). 0: a stall never "
        "counts.")

    pause_ratio: NonNeg = _doc(
        "Jobs read whole: an event is part of a job-wide pause (the whole job stalled at once: no "
        "device's fault, said in an assumption) when the significant cells its device cannot explain "
        "cost every host of the job at least this many times the event's own excess over the number "
        "of hosts (together at least this many times it, no host spared). 0: never.")

    # ---- Algorithm 1: the search's bound (holmes.localize.search) ----------------------------------------
    search_max_steps: PosCount = _doc(
        "Safety bound on the operators one search visits (holmes.localize.search.GraphSearch).")

    @field_validator("*", mode="before")
    @classmethod
    def _plain(cls, v: Any) -> Any:
        """numpy scalars as Python numbers (a bool stays a bool; strict mode refuses it for a number)."""
        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.floating):
            return float(v)
        return v

    def replace(self, **changes: Any) -> "Thresholds":
        """A copy with some thresholds changed, validated again (an unknown name is an error)."""
        return _build({**self.as_dict(), **changes}, "(overrides)")

    def as_dict(self) -> dict[str, Any]:
        """Every threshold by name, as JSON values."""
        return {k: getattr(self, k) for k in type(self).model_fields}

    def changed(self, base: "Thresholds | None" = None) -> dict[str, Any]:
        """The thresholds whose values differ from ``base`` (default: the shipped file's)."""
        ref = (base or load_thresholds()).as_dict()
        return {k: v for k, v in self.as_dict().items() if v != ref[k]}


def or_shipped(value: Any, name: str) -> Any:
    """``value``, or the shipped file's threshold ``name`` when it is None: the default of a helper's
    threshold argument (the analyses pass the run's own, ``params.t.<name>``).

    >>> or_shipped(None, "stretch_z") == load_thresholds().stretch_z, or_shipped(7.0, "stretch_z")
    (True, 7.0)
    """
    return getattr(load_thresholds(), name) if value is None else value


def threshold_names() -> tuple[str, ...]:
    """Every threshold's name, in the file's order."""
    return tuple(Thresholds.model_fields)


def load_thresholds(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Thresholds:
    """The thresholds of a file (default: the shipped one), with some values overridden.

    Parameters
    ----------
    path : path, optional
        A thresholds file (``{"schema": "holmes.thresholds/1", "thresholds": {...}}``). The shipped
        file must name every threshold; another file may name some, the rest keep the shipped values.
    **overrides
        Values that replace the file's (validated the same way).

    Returns
    -------
    Thresholds
        Read once per file (and file version) and shared: it is immutable.

    Raises
    ------
    ThresholdsError
        The file is missing, not JSON, of another schema, or names an unknown threshold or a value of
        the wrong type (also a ``ConfigError`` and a ``ValueError``).
    """
    p = Path(path) if path is not None else DEFAULT_PATH
    try:
        st = p.stat()
    except OSError as exc:
        raise ThresholdsError(f"thresholds {p}: cannot read ({exc.strerror or exc})") from None
    t = _load(str(p.resolve()), st.st_mtime_ns, st.st_size)
    return t.replace(**overrides) if overrides else t


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, size: int) -> Thresholds:
    """The parsed file (keyed by its version too: a file ``scripts/tune.py`` rewrote is read again)."""
    try:  # the capped reader: a FIFO or /dev/zero is refused, not read forever
        doc = read_json_capped(path, error=ThresholdsError, what="thresholds file")
    except ThresholdsError as exc:
        raise ThresholdsError(f"thresholds {path}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ThresholdsError(f"thresholds {path}: schema must be {SCHEMA!r} (got {got!r})")
    values = doc.get("thresholds")
    if not isinstance(values, Mapping):
        raise ThresholdsError(f"thresholds {path}: 'thresholds' must be an object of name: value")
    if Path(path) == DEFAULT_PATH.resolve():
        missing = [k for k in Thresholds.model_fields if k not in values]
        if missing:
            raise ThresholdsError(f"thresholds {path}: missing threshold(s) {', '.join(missing)}")
        return _build(dict(values), path)
    return _build({**load_thresholds().as_dict(), **values}, path)


def _build(values: dict[str, Any], source: str) -> Thresholds:
    try:
        return Thresholds(**values)
    except ValidationError as exc:
        parts = []
        for e in exc.errors():
            key = ".".join(str(x) for x in e.get("loc", ())) or "thresholds"
            if e.get("type") == "extra_forbidden":
                parts.append(f"unknown threshold {key!r}")
            elif e.get("type") == "missing":
                parts.append(f"missing threshold {key!r}")
            else:
                got = repr(e.get("input"))
                parts.append(f"{key}: {e.get('msg', 'invalid')} (got {got if len(got) <= 60 else got[:57] + '...'})")
        raise ThresholdsError(f"thresholds {source}: " + "; ".join(parts)) from None


def _kind(annotation: Any) -> str:
    """A value kind in words: ``float``, ``int``, ``bool``, ``int or null``, ``"a" or "b"``."""
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return " or ".join(f'"{a}"' for a in args)
    if args and type(None) in args:
        return " or ".join("null" if a is type(None) else _kind(a) for a in args)
    if args:  # Annotated[float, ...]
        return _kind(args[0])
    return getattr(annotation, "__name__", str(annotation))


def docs_markdown() -> str:
    """The reference table of ``docs/thresholds.md``: every name, its type and meaning."""
    rows = ["| name | type | meaning |", "|---|---|---|"]
    for k, f in Thresholds.model_fields.items():
        rows.append(f"| `{k}` | {_kind(f.annotation)} | {(f.description or '').replace('|', '/')} |")
    return "\n".join(rows) + "\n"

