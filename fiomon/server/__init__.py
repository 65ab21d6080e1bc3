"""The one service shell of ``fiomon aggregator`` and ``fiomon root``.

Start-up, signals, the ordered stop, the MQTT intake, the state directory and
publication, shared by the two mergers that plug into it
(:class:`fiomon.server.app.Server`, :class:`fiomon.server.app.Merger`). Import the
modules themselves: this package loads nothing, so ``fiomon.server.alerts`` stays
importable without the MQTT client.
"""
