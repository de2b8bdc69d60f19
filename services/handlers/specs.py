"""Every example handler service, by name (the name is the context it serves)."""

from __future__ import annotations

from shared.domain.errors import ConfigurationError

from .contexts import module_f, module_g, module_h, sea, vibespro
from .service import ServiceSpec

#: Stably ordered: the order is what ``--help`` and error messages show.
SERVICES: dict[str, ServiceSpec] = {
    spec.name: spec
    for spec in (sea.SPEC, vibespro.SPEC, module_f.SPEC, module_g.SPEC, module_h.SPEC)
}


def service_spec(name: str) -> ServiceSpec:
    """The service called ``name``, or a :class:`ConfigurationError` listing the known ones."""
    try:
        return SERVICES[name]
    except KeyError:
        raise ConfigurationError(
            f"no handler service {name!r} (known: {', '.join(SERVICES)})"
        ) from None
