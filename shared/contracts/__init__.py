"""Contracts: what a deployment declares and what every role checks before it runs.

The topology file's models (:mod:`.topology`), the event manifests (:mod:`.manifests`),
the handler registry generated from them (a data file, :mod:`.registry_file`, built and
checked by :mod:`.codegen`, read at run time through :mod:`.events`; :mod:`.layout` says
where Ferry's own are) and the lint rules (:mod:`.lint`); AsyncAPI documents of a topology
(:mod:`.asyncapi`). Pydantic, YAML and JSON Schema; no driver, no I/O but reading files.
Imports only :mod:`shared.domain` below it.
"""
