"""What `navrl-daemon run` builds from a config: the stages, their channels, and where
their reports go, handed to the generic supervisor (runtime/supervisor.py).

- `daemon`: run / serve / build: the wiring, which reads like the pipeline's diagram;
- `telemetry`: logs, Prometheus, /healthz, systemd and history rows;
- `context`: RunContext, and the offline objectives' protocol (navrl_daemon/offline/
  implements it; `run` hands it in);
- `ranks`: the process groups of a distributed run (torchrun).
"""
