"""The aggregator: merges records into quanta, exports metrics, evaluates SLA rules."""
