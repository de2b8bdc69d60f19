"""``cluster``, ``cluster-leader``, ``cluster-meta-leader``, ``cluster-partition``,
``cluster-rolling``, ``cluster-ci``: the pipeline on a 3-node JetStream cluster under node
faults (:mod:`chaos.scenarios.cluster.run`)."""
