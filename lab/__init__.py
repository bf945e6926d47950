"""The lab: what the benchmarks and the tests drive a real server with. It is not part of the installed package.

* :mod:`lab.herd`: a real-network thundering herd, and ``admitgate demo --herd N`` (run from the source tree);
* :mod:`lab.http1`: a lean HTTP/1.1 client for it;
* :mod:`lab.serving`: free loopback ports, core pinning, and the demo server in a child process;
* :mod:`lab.redis`: waiting for a Redis server just started;
* :mod:`lab.trials`: the capacity estimators' trials on the simulator;
* :mod:`lab.matrix_cells`: the scenario matrix's cells and targets, and the figures it computes from a run's records.
"""
