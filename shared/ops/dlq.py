"""Dead letters (REQ-053, REQ-059, INFRA-005 §4.3): what ``ferry dlq`` (shared/cli/dlq.py)
and the console do with them.

Finding them across every database of the topology (:mod:`shared.ops.dlq_find`), one in
full (:mod:`shared.ops.dlq_show`), and the audited changes — replay, park, discard — of
one dead letter (:mod:`shared.ops.dlq_change`): each recorded in ``dead_letter_actions``
with who, when and why. This module gathers them for their callers.
"""

from __future__ import annotations

from shared.ops.dlq_change import change_status as change_status
from shared.ops.dlq_change import replay_dead_letter as replay_dead_letter
from shared.ops.dlq_change import set_dead_letter_status as set_dead_letter_status
from shared.ops.dlq_find import find_dead_letters as find_dead_letters
from shared.ops.dlq_find import public as public
from shared.ops.dlq_show import show_dead_letter as show_dead_letter

#: The states of a dead letter (``--status``).
STATUSES = ("dead", "held", "replaying", "replayed", "parked", "discarded")
