"""The one service shell of ``fiomon aggregator`` and ``fiomon root``.

Start-up, signals, the ordered stop, the state directory and publication, shared by the
two mergers that plug into it.
"""
