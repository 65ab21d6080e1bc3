"""Tools around fio: the demo, the simulator and `fiomon fio`."""
