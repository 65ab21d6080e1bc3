"""``fiomon aggregator``: the record merger (decode, dedup, watermark, engine) and its service."""
