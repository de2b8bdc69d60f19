"""Example handler services: aiohttp apps honouring the handler contract (SDS-047 §12).

``python -m services.handlers --service NAME`` runs one of them (see
:mod:`services.handlers.specs`). :func:`~services.handlers.app.make_app` and
:class:`~services.handlers.service.HandlerService` are the framework; the payload-driven
fault injection used by demos and tests is documented in :mod:`services.handlers.faults`.
"""
