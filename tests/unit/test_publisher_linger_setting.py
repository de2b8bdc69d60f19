"""Which linger an outbox-publisher uses: FERRY_PUBLISHER_LINGER when set, else its
context's ``publisher_linger`` from the topology, else the setting's default."""

from __future__ import annotations

import pydantic
import pytest

from services.outbox_publisher.__main__ import fill_linger
from shared.contracts.topology import ContextSpec
from shared.runtime.settings import PublisherSettings

CONTEXT = {"database": "d", "namespace": "lane.e", "dead_letter_subject": "lane.dlq"}


def test_the_topology_gives_the_linger_unless_the_setting_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FERRY_PUBLISHER_LINGER", raising=False)
    lingering = ContextSpec.model_validate({**CONTEXT, "publisher_linger": "60ms"})
    plain = ContextSpec.model_validate(CONTEXT)
    default = PublisherSettings().publisher_linger
    assert fill_linger(PublisherSettings(), lingering) == pytest.approx(0.06)
    assert fill_linger(PublisherSettings(), plain) == default
    monkeypatch.setenv("FERRY_PUBLISHER_LINGER", "0")
    assert fill_linger(PublisherSettings(), lingering) == 0.0


@pytest.mark.parametrize("value", ["2s", "-1ms", "soon"])
def test_a_linger_out_of_range_names_the_field(value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="publisher_linger"):
        ContextSpec.model_validate({**CONTEXT, "publisher_linger": value})
