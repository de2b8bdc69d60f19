"""Settings of the handler role (environment prefix ``FERRY_``, like every role)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings


class HandlerSettings(CommonSettings):
    """handler-<service>: one example handler service, serving its context's durables."""

    #: The service to run; also the context whose database it uses (``sea``, ``module_f``...).
    service: str | None = None
    #: Port to listen on. Unset: every port named by the handler URLs of the durables
    #: that target this context (module_g serves two durables, so two ports).
    port: int | None = Field(default=None, ge=0, le=65535)
    #: Interface to bind.
    host: str = "127.0.0.1"
