"""The machine: topology, CPU lists, placement of instances, environment, per-instance env."""
