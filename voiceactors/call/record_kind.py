"""The kinds of a call record's lines (``record.py`` has each one's fields).

One enum for the record's writer and every reader (recovery, the history
API, the timeline, the cluster's mirror): a kind is spelled once, and a
reader names the kinds it handles instead of comparing strings. A member IS
its string (a ``StrEnum``): it is written to disk, compared with a line read
back and used as a dict key exactly as the bare string was, so records
written before and after this enum are byte for byte the same.

No imports of the package: the sans-IO protocol, the record writer and the
readers in ``http/`` and ``cluster/`` all import it without a cycle.
"""

from __future__ import annotations

from enum import StrEnum


class RecordKind(StrEnum):
    """A call record line's ``kind``."""

    START = "start"                      # a run's first line
    CONTEXT = "context"                  # the call's linked context, as the run starts
    CONNECT = "connect"                  # a sideband connection is up
    RECONNECT = "reconnect"              # a reconnect is scheduled
    RESPONSE = "response"                # a response ended
    RESPONSE_CREATE = "response_create"  # a response.create of ours and what became of it
    TOOL_STARTED = "tool_started"        # a tool call went to the executor
    TOOL_CALL = "tool_call"              # a tool call settled (or the run ended first)
    SELECTION = "selection"              # journal.select chose what the call is about
    HOSTED_TOOL = "hosted_tool"          # the service ran an OpenAI-hosted MCP tool (never answered by us)
    TRANSCRIPT = "transcript"            # one final utterance
    TRANSCRIPT_CUT = "transcript_cut"    # an earlier utterance's reply was cut short
    USAGE = "usage"                      # one response's tokens and cost
    AUDIO_USAGE = "audio_usage"          # a Live session's seconds of audio a usage report added, and their cost
    BUDGET = "budget"                    # the call's cost reached its budget
    IDLE = "idle"                        # the service's idle timeout fired (check-in, or goodbye)
    SLOW_ACK = "slow_ack"                # a batch's slow tool calls were acknowledged (the user hears so)
    SLOW_PROGRESS = "slow_progress"      # an acknowledged call's progress was spoken (one line)
    SLOW_OUTPUT = "slow_output"          # an acknowledged tool call answered: the wait ended
    SLOW_DELIVERY = "slow_delivery"      # an acknowledged batch's outputs are spoken (its follow-up)
    HEARD = "heard"                      # a reply cut short: what the user heard of it, which writes were done
    WRAP_UP = "wrap_up"                  # the call's time limit is near: the assistant is asked to say so
    PHONE = "phone"                      # a phone call's PIN keyed (right, wrong, refused) or transfer asked
    TURN = "turn"                        # a user turn's latency: the end of speech to the reply's first sound
    HANDOFF = "handoff"                  # a handoff between agents: started, done, failed or refused
    USAGE_TOTAL = "usage_total"          # the run's tokens and cost, at its end
    END = "end"                          # a run's last line (none after a crash)


#: Kinds the writer flushes at once (the ones a restart needs: recovery reads them).
URGENT_KINDS = frozenset({RecordKind.START, RecordKind.TOOL_STARTED, RecordKind.TOOL_CALL, RecordKind.HANDOFF,
                          RecordKind.END})
#: The tool lines: recovery's and the cluster mirror's (its ``pending:`` hash).
TOOL_KINDS = frozenset({RecordKind.TOOL_STARTED, RecordKind.TOOL_CALL})
