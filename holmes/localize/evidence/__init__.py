"""Evidence every analysis shares: the graph search over the ranks read so far
(:mod:`.search`), the job source that fetches them (:mod:`.sources`), the device ranking and its
kinds (:mod:`.ranking`), the verdict confidence (:mod:`.confidence`) and each rank's summary
per step (:mod:`.rank_summary`)."""
