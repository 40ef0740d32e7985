"""The numba timing engine: runs a :class:`~holmes.simulate.program.Program` for one iteration.

Semantics (integer nanoseconds throughout, so results are exact and reproducible):

* Ops on a rank run in issue order. Op ``j`` of rank ``r`` is *entered* (``start_ns``) at the
  completion of the rank's previous op (or the start of the iteration) plus its compute gap:
  ``round(mean_gap * noise * mult[r])`` with ``noise = exp(sigma * z)``, ``z`` a standard
  normal drawn from a counter-based generator (SplitMix64 of ``(seed, rank, iteration,
  op_index)``), times ``1 + tail_scale * min(E, TAIL_CAP)`` with probability ``tail_prob``
  (:func:`noise_factor`: a lognormal body and a rare long tail); ``mult`` is the rank's
  multiplier in that iteration: the per-iteration job-wide and per-rank noise, drift and compute
  faults (exactly ``int(mean * noise * mult + 0.5)``, the formula :func:`rank_starts` repeats).
* An *instance* (one logical collective on a communicator, or one send/recv pair) completes on
  all its members at ``max(entry over members) + transfer``; P2P is a blocking rendezvous:
  both ends complete at ``max(send entry, recv entry) + transfer``.
* ``transfer = round((latency + volume * max(1/bw, max over faulted crossed devices F/bw_d))
  * noise')``, ``noise'`` the same kind of factor (``xfer_jitter``, ``xfer_tail_prob``,
  ``xfer_tail_scale``) drawn from ``(seed, instance, iteration)``.
* The iteration of a rank ends at its last op's completion plus the compute tail (optimizer);
  the next iteration starts there.

The run is a worklist over ranks: a rank advances until it arrives at an instance whose other
members have not all arrived; the last arrival completes the instance and wakes its members.
If the worklist empties before every op completed, the program deadlocks and the caller raises.
Because the noise is a pure function of its counters, the fault-free counterfactual run sees
exactly the same noise as the faulted one and nothing has to be stored.
"""

from __future__ import annotations

import numpy as np

from holmes._jit import njit
from holmes.simulate.program import TAIL_CAP

__all__ = ["noise_factor", "iteration_noise", "run_iteration", "rank_starts", "label_and_store", "gap_ns"]

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
_INV53 = 1.0 / 9007199254740992.0
_TAIL_CAP = TAIL_CAP


@njit(cache=True, inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _M2
    z = (z ^ (z >> np.uint64(27))) * _M3
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _hash4(seed, a, b, c):
    h = _mix(np.uint64(seed) + _M1)
    h = _mix(h ^ (np.uint64(a) + _M1))
    h = _mix(h ^ (np.uint64(b) * _M1 + np.uint64(0x632BE59BD9B4E019)))
    h = _mix(h ^ (np.uint64(c) * _M2 + np.uint64(0x8CB92BA72F3D8DD7)))
    return h


@njit(cache=True)
def _normal(h):
    u1 = (float(h >> np.uint64(11)) + 0.5) * _INV53
    h2 = _mix(h + _M1)
    u2 = float(h2 >> np.uint64(11)) * _INV53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@njit(cache=True, inline="always")
def _uniform(h):
    return (float(h >> np.uint64(11)) + 0.5) * _INV53


@njit(cache=True)
def noise_factor(h, sigma, tail_p, tail_s):
    """The noise factor of one draw from hash ``h``: ``exp(sigma * z)``, times ``1 + tail_s *
    min(E, TAIL_CAP)`` (``E ~ Exp(1)``) with probability ``tail_p`` -- a lognormal body with a
    rare long tail."""
    f = np.exp(sigma * _normal(h)) if sigma > 0.0 else 1.0
    if tail_p > 0.0:
        h3 = _mix(h ^ _M3)
        if _uniform(h3) < tail_p:
            e = -np.log(_uniform(_mix(h3 + _M2)))
            f *= 1.0 + tail_s * min(e, _TAIL_CAP)
    return f


@njit(cache=True)
def gap_ns(mean, mult, sigma, tail_p, tail_s, seed, rank, it, opi):
    """Compute gap (int ns) before op ``opi`` of ``rank`` in iteration ``it``:
    ``round((mean * noise_factor) * mult)``."""
    if mean <= 0.0:
        return np.int64(0)
    return np.int64(mean * noise_factor(_hash4(seed, rank, it, opi), sigma, tail_p, tail_s) * mult + 0.5)


@njit(cache=True, nogil=True)
def iteration_noise(it, seed, sigma, tail_p, tail_s, xsigma, xtail_p, xtail_s, rank_ptr, gap_mean, tail_mean,
                    noise, tail_noise, inst_noise):
    """The noisy gaps ``mean * noise_factor`` of every op and tail and the transfer noise
    factor of every instance in iteration ``it`` (shared by both runs)."""
    W = rank_ptr.size - 1
    for r in range(W):
        base = rank_ptr[r]
        n = rank_ptr[r + 1] - base
        for k in range(n):
            m = gap_mean[base + k]
            if m > 0.0:
                noise[base + k] = m * noise_factor(_hash4(seed, r, it, k), sigma, tail_p, tail_s)
            else:
                noise[base + k] = 0.0
        m = tail_mean[r]
        tail_noise[r] = m * noise_factor(_hash4(seed, r, it, n), sigma, tail_p, tail_s) if m > 0.0 else 0.0
    for i in range(inst_noise.size):
        inst_noise[i] = noise_factor(_hash4(seed ^ 0x5EED, i, it, 0x7F4A7C15), xsigma, xtail_p, xtail_s)


@njit(cache=True, nogil=True)
def run_iteration(noise, tail_noise, inst_noise, rank_ptr, inst, inst_ptr, inst_members,
                  inst_xgroup, inst_vol, inst_lat, xg_inv_bw, xg_fptr, xg_fidx, xg_finv, fac_it, mult,
                  row_rank, clock, out_start, out_end, arrivals, maxentry, pos, stack):
    """Run one iteration; ``clock`` (per rank, int64) holds the iteration starts on entry and
    the iteration ends on exit. ``noise``/``tail_noise``/``inst_noise`` come from
    :func:`iteration_noise`. Returns the number of ops that completed (== len(inst) unless the
    program deadlocks)."""
    W = rank_ptr.size - 1
    n_inst = inst_ptr.size - 1
    for i in range(n_inst):
        arrivals[i] = 0
        maxentry[i] = np.iinfo(np.int64).min
    top = 0
    for r in range(W - 1, -1, -1):
        pos[r] = 0
        stack[top] = r
        top += 1
    done = 0
    while top > 0:
        top -= 1
        r = stack[top]
        base = rank_ptr[r]
        n = rank_ptr[r + 1] - base
        mr = mult[r]
        while pos[r] < n:
            j = base + pos[r]
            entry = clock[r] + np.int64(noise[j] * mr + 0.5)
            out_start[j] = entry
            i = inst[j]
            arrivals[i] += 1
            if entry > maxentry[i]:
                maxentry[i] = entry
            if arrivals[i] < inst_ptr[i + 1] - inst_ptr[i]:
                break  # blocked until the last member arrives
            x = inst_xgroup[i]
            ib = xg_inv_bw[x]
            for k in range(xg_fptr[x], xg_fptr[x + 1]):
                v = fac_it[xg_fidx[k]] * xg_finv[k]
                if v > ib:
                    ib = v
            t = (inst_lat[i] + inst_vol[i] * ib) * inst_noise[i]
            end = maxentry[i] + np.int64(t + 0.5)
            for m in range(inst_ptr[i], inst_ptr[i + 1]):
                row = inst_members[m]
                out_end[row] = end
                rr = row_rank[row]
                clock[rr] = end
                pos[rr] += 1
                done += 1
                if rr != r:
                    stack[top] = rr
                    top += 1
    for r in range(W):
        if pos[r] == rank_ptr[r + 1] - rank_ptr[r]:
            clock[r] += np.int64(tail_noise[r] * mult[r] + 0.5)
    return done


@njit(cache=True, nogil=True)
def label_and_store(f_start, f_end, c_start, c_end, row_rank, iter_start, margin, abs_ns, store, abn):
    """Label abnormal ops (faulted vs counterfactual duration) and store end offsets.

    ``abn[j] = d_f > (1 + margin) * d_cf and d_f - d_cf > abs_ns``; ``store[j] = f_end[j] -
    iter_start[rank]``. Returns the largest offset (to check it fits the store's dtype).
    """
    big = np.int64(0)
    for j in range(f_end.size):
        df = f_end[j] - f_start[j]
        dc = c_end[j] - c_start[j]
        abn[j] = (df > (1.0 + margin) * dc) and (df - dc > abs_ns)
        off = f_end[j] - iter_start[row_rank[j]]
        if off > big:
            big = off
        store[j] = off
    return big


@njit(cache=True, nogil=True)
def rank_starts(rank, ends, it_start, gap_mean, mult, sigma, tail_p, tail_s, seed):
    """Rebuild the ``start_ns`` of one rank (iterations x ops) from its ends and the noise."""
    n_it, n = ends.shape
    out = np.empty_like(ends)
    for t in range(n_it):
        prev = it_start[t]
        for k in range(n):
            out[t, k] = prev + gap_ns(gap_mean[k], mult[t], sigma, tail_p, tail_s, seed, rank, t, k)
            prev = ends[t, k]
    return out
