"""Work-unit sizes of the map/reduce analyses (engineering constants, not thresholds).

How many ranks one map task reads and how many operators one reduce block holds trade memory per
process against tasks' overhead; they change no result (the persistent analysis's report is the
same for any chunking: ``tests/test_persistent_partials.py``).
"""

from __future__ import annotations

__all__ = ["INPROCESS_CHUNK", "DISTRIBUTED_CHUNK", "OPS_PER_RANK_ITERATION", "INPROCESS_BLOCKS", "BLOCK_ROWS",
           "PROGRAM_SLICE_ROWS", "SLOT_HASH_MULTIPLIERS",
           "INSTANCE_KEY_BITS"]

#: ranks per map task in this process (the read batches of one task: its memory)
INPROCESS_CHUNK = 1024
#: ranks per map task on a cluster
DISTRIBUTED_CHUNK = 1024
#: the operators of a rank in an iteration, about, to size the blocks before reading (Megatron-style
#: 3D jobs log 10-40)
OPS_PER_RANK_ITERATION = 25
#: reduce blocks in this process, at least (more for a large job: :data:`BLOCK_ROWS`)
INPROCESS_BLOCKS = 1
#: window operators per reduce block, about (one block's partial folds, a fifth of them or less, are
#: a task's input)
BLOCK_ROWS = 4_000_000
#: rows per slice where the what-if program's rows are mapped in slices
PROGRAM_SLICE_ROWS = 1 << 22
#: the multipliers of a slot's sender and receiver in its block hash (primes: the same block in every
#: process, whatever the chunk)
SLOT_HASH_MULTIPLIERS = (1_000_003, 7_919)
#: bits of an operator instance's number in a (reduce block, number) key
INSTANCE_KEY_BITS = 40
