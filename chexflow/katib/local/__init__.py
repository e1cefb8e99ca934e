"""The local runner: trials as local processes, their state, metrics and results."""
