"""Ferry's common package: the pure domain, the topology, settings and adapters.

Every role (``services/*``) imports from here; roles never import each other.
"""
