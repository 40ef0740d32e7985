"""The irregular analysis: which iterations of the pivot are irregular, the root causes that explain
them and the devices they implicate (:class:`.analysis.IrregularAnalysis`), by one of two strategies
chosen per job: the whole job compared cell by cell (:class:`.analysis.WholeJobComparison`,
:mod:`.cells`) or Algorithm 1 from the pivot on the detector's labels (:class:`.analysis.PivotSearch`)."""
