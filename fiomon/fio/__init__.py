"""fio's outputs as fiomon reads them: the input-format layer.

Recognition by content (:mod:`~fiomon.fio.parsers`, :mod:`~fiomon.fio.decode`), the
histogram logs (:mod:`~fiomon.fio.fiolog` over :mod:`~fiomon.fio.linescan`), the json+
status stream (:mod:`~fiomon.fio.fiojson`), fio ``--client`` logs
(:mod:`~fiomon.fio.clientlog`), which file holds which I/Os (:mod:`~fiomon.fio.overlap`)
and the problems reading met (:mod:`~fiomon.fio.problems`). Everything above (the maths,
the agent, the offline commands) gets :class:`~fiomon.model.RecordBatch` values from here.
"""
