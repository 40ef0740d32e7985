"""The hang analysis: the wait-for graph of a stuck job, its roots, waiting chains and deadlocks
(:class:`.analysis.HangAnalysis`, :mod:`.waitgraph`)."""
