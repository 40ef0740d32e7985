"""Job I/O: CommOps schema v1, job directories, job.json and truth.json."""

from holmes.io.consistency import ConsistencyLog, check_iterations, check_ops
from holmes.io.job import Job, JobWriter, MemoryJob, ReadStats, derive_iterations, rank_filename, read_job, write_job
from holmes.io.models import JobMeta, SourceInfo, TruthModel
from holmes.io.schema import (COLLECTIVE_OPS, COMPUTE_SCHEMA, ITERATIONS_SCHEMA, OP_NAMES, OPS_SCHEMA, P2P_OPS,
                              SCHEMA_ID, compute_table, validate_compute,
                              iterations_table, ops_table, validate_iterations, validate_ops)

__all__ = ["ConsistencyLog", "check_ops", "check_iterations", "Job", "JobWriter", "MemoryJob", "ReadStats", "derive_iterations", "rank_filename", "read_job",
           "write_job", "JobMeta", "SourceInfo", "TruthModel", "COLLECTIVE_OPS", "ITERATIONS_SCHEMA", "OP_NAMES",
           "OPS_SCHEMA", "P2P_OPS", "SCHEMA_ID", "iterations_table", "ops_table", "validate_iterations",
           "COMPUTE_SCHEMA", "compute_table", "validate_compute",
           "validate_ops"]
