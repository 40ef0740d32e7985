"""The irregular analysis: which iterations of the pivot are irregular, the root causes that explain
them (Algorithm 1, or the cells of a job read whole) and the devices they implicate
(:class:`.analysis.IrregularAnalysis`)."""
