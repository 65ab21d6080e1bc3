"""``fiomon root``: the partials merger (cells' closed quanta in, exact cluster quanta out)."""
