"""What every chaos run is made of: the world (servers, proxies, roles), the workload and
its ledger, the faults, the engine that plays, drains and counts, the result writer."""
