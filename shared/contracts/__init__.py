"""Contracts: what a deployment declares and what every role checks before it runs.

The topology file's models (:mod:`.topology`), the event manifests (:mod:`.manifests`),
the handler registry generated from them (:mod:`.generated_registry`, built and checked by
:mod:`.codegen`, read at run time through :mod:`.events`) and the lint rules
(:mod:`.lint`). Pydantic, YAML and JSON Schema; no driver, no I/O but reading files.
Imports only :mod:`shared.domain` below it.
"""
