"""The persistent analysis: ranks slower than their role peers in every iteration, the devices
behind them and the what-if replay of the job without them
(:class:`.analysis.PersistentAnalysis`)."""
