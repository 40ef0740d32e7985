"""A 2-rank gloo job calling every wrapped ``torch.distributed`` function once per iteration.

Run by ``tests/test_logger_torch.py`` in a subprocess: ``python tests/e2e_torch_job.py OUT_DIR``.
It captures with :class:`holmes.logger.CommOpsLogger` and writes ``OUT_DIR/expected.json``: the
operators each rank issued, in order, with their CommOps names, comm ids and sizes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from datetime import timedelta

WORLD = 2
ITERATIONS = 2


def worker(rank: int, out_dir: str, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    import holmes.logger

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor is deprecated
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    tp = dist.new_group([0, 1], group_desc="TENSOR_MODEL_PARALLEL_GROUP")
    other = dist.new_group([0, 1])
    logger = holmes.logger.CommOpsLogger(out_dir, flush_every=4, groups={"dp": [other]})
    peer = 1 - rank
    p2p_before = dist.P2POp(dist.isend if rank == 0 else dist.irecv, torch.zeros(3), peer)
    logger.enable()
    expected = []
    tp_id, other_id = f"tp-g{tp.group_name}", f"dp-g{other.group_name}"
    for it in range(ITERATIONS):
        logger.step(it)
        t = torch.ones(8)  # 32 bytes
        dist.all_reduce(t, group=tp)
        expected.append((tp_id, "all_reduce", None, 32))
        dist.all_reduce(t, group=other, async_op=True).wait()
        expected.append((other_id, "all_reduce", None, 32))
        outs = [torch.empty(8) for _ in range(WORLD)]
        dist.all_gather(outs, t)
        expected.append(("world", "all_gather", None, 64))
        dist.all_gather_into_tensor(torch.empty(16), t, group=tp)
        expected.append((tp_id, "all_gather", None, 64))
        dist.reduce_scatter(torch.empty(8), [torch.ones(8) for _ in range(WORLD)], group=tp)
        expected.append((tp_id, "reduce_scatter", None, 64))
        dist.all_to_all_single(torch.empty(8), torch.ones(8), group=tp)
        expected.append((tp_id, "all_to_all", None, 32))
        dist.broadcast(t, src=0)
        expected.append(("world", "broadcast", None, 32))
        dist.reduce(t, dst=1, group=tp)
        expected.append((tp_id, "reduce", None, 32))
        dist.barrier()
        expected.append(("world", "barrier", None, 0))
        buf = torch.zeros(4)  # 16 bytes
        if rank == 0:
            dist.send(buf, dst=1)
            dist.isend(buf, dst=1, group=tp).wait()
            src = dist.recv(buf)  # from any source
            expected += [("world", "send", 1, 16), (tp_id, "send", 1, 16), ("world", "recv", 1, 16)]
        else:
            dist.recv(buf, src=0)
            dist.irecv(buf, src=0, group=tp).wait()
            dist.send(buf, dst=0)
            expected += [("world", "recv", 0, 16), (tp_id, "recv", 0, 16), ("world", "send", 0, 16)]
        ops = [dist.P2POp(dist.isend, torch.ones(2), peer), dist.P2POp(dist.irecv, torch.zeros(2), peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        expected += [("world", "send", peer, 8), ("world", "recv", peer, 8)]
    # a P2POp built before enable() still works inside batch_isend_irecv
    for w in dist.batch_isend_irecv([p2p_before]):
        w.wait()
    expected.append(("world", "send" if rank == 0 else "recv", peer, 12))
    logger.close()
    # after close the originals are back and P2POps built while enabled still work
    restored = all(getattr(dist, n) is getattr(dist.distributed_c10d, n) for n in holmes.logger.WRAPPED_FUNCTIONS)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend if rank == 0 else dist.irecv, torch.zeros(1), peer)]):
        w.wait()
    with open(os.path.join(out_dir, f"expected-{rank}.json"), "w") as f:
        json.dump({"ops": expected, "restored": restored, "iterations": ITERATIONS}, f)
    dist.destroy_process_group()


def main(out_dir: str) -> None:
    import torch.multiprocessing as mp

    import holmes.logger  # noqa: F401 - shared with forked workers

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, nprocs=WORLD, args=(out_dir, os.path.join(tmp, "store")), start_method=method)


if __name__ == "__main__":
    main(sys.argv[1])
