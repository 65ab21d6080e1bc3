"""Offline commands on finished runs: report, summary, fit (and plot)."""
