"""Who may call (``phone_policy``): the caller read from the INVITE's headers
(``P-Asserted-Identity`` first, else ``From``; anything that is not an
E.164 number is a withheld one), the masked number, and the ``voice.phone``
block's checks (``serve`` refuses to start with a bad value)."""

from __future__ import annotations

import json

import pytest

from voiceactors import phone_policy
from voiceactors.http.app import create_app
from voiceactors.phone_policy import Caller, CallerVerdict, PhoneSettings, caller_of
from voiceactors.settings import InvalidSettings, Settings

OWNER = "+15551234567"


@pytest.mark.parametrize("headers, expected", [
    ([("From", f'"Me" <sip:{OWNER}@trunk.example;user=phone>;tag=1')], Caller(OWNER, "from")),
    ([("from", f"<tel:{OWNER}>")], Caller(OWNER, "from")),
    ([("From", f"sip:{OWNER}@trunk.example;tag=9")], Caller(OWNER, "from")),
    ([("From", "<tel:+1-555-123-4567>")], Caller(OWNER, "from")),                 # visual separators
    ([("From", '"Anonymous" <sip:anonymous@anonymous.invalid>')], Caller(None, "from")),
    ([("From", "<sip:alice@example.com>")], Caller(None, "from")),                # a SIP user, not a number
    ([("From", "<sip:5551234567@trunk.example>")], Caller(None, "from")),         # no country code: not E.164
    ([], Caller(None, None)),
    # the trunk's assertion wins over what the caller put in From
    ([("From", f"<sip:{OWNER}@x>"), ("P-Asserted-Identity", "<tel:+447700900123>")], Caller("+447700900123",
                                                                                          "p-asserted-identity")),
    # several identities in one header (a SIP and a tel URI): the first number
    ([("P-Asserted-Identity", f'"Me" <sip:bob@example.com>, <tel:{OWNER}>')], Caller(OWNER, "p-asserted-identity")),
    # an asserted anonymous caller: From is not read
    ([("From", f"<sip:{OWNER}@x>"), ("P-Asserted-Identity", "<sip:anonymous@anonymous.invalid>")],
     Caller(None, "p-asserted-identity")),
], ids=["name_addr", "tel", "addr_spec", "separators", "anonymous", "sip_user", "national", "no_from",
        "asserted_wins", "asserted_list", "asserted_anonymous"])
def test_the_caller_is_read_from_the_asserted_identity_else_from(headers, expected):
    assert caller_of(headers) == expected


def test_a_verdict_and_the_masked_number():
    phone = PhoneSettings(frozenset({OWNER}))
    assert Caller(OWNER, "from").verdict(phone) == CallerVerdict.ALLOWED
    assert Caller("+15551234568", "from").verdict(phone) == CallerVerdict.UNKNOWN
    assert Caller(None, "from").verdict(phone) == CallerVerdict.WITHHELD
    assert Caller(OWNER, "from").verdict(PhoneSettings()) == CallerVerdict.UNKNOWN   # nobody listed: nobody in
    assert phone_policy.masked(OWNER) == "+1••••••••67"


def test_the_phone_block_is_checked_value_by_value():
    phone, problems = phone_policy.parse({"allowed_callers": [OWNER, "5551234567", 7], "pin": "98",
                                         "transfer_to": "http://example.com", "pine": "1"})
    assert phone == PhoneSettings(frozenset({OWNER}), pin_invalid=True)   # a bad PIN refuses calls, never opens them
    assert len(problems) == 5 and "voice.phone.pine is not a phone setting" in problems
    assert not any("98" in p for p in problems)        # the PIN itself is never echoed
    good, none = phone_policy.parse({"allowed_callers": [OWNER], "pin": "0246", "transfer_to": "sip:desk@pbx.example"})
    assert none == [] and good.pin == "0246" and good.transfer_to == "sip:desk@pbx.example"
    assert phone_policy.parse(None) == (PhoneSettings(), [])
    assert phone_policy.parse([OWNER])[1] == ["voice.phone must be an object"]


def test_serve_refuses_a_bad_phone_block(tmp_path):
    journal = tmp_path / "journal"
    (journal / "config").mkdir(parents=True)
    (journal / "config" / "journal.json").write_text(json.dumps({"voice": {"phone": {"allowed_callers": ["555"]}}}))
    with pytest.raises(InvalidSettings, match="allowed_callers"):
        create_app(Settings(journal=journal, state_dir=tmp_path / "state"))


def test_a_carried_phone_call_is_locked_again_with_the_pin_as_it_is_now(tmp_path):
    """What a rejoin (the record's context line) and a takeover (the cluster's
    mirror) carry of a phone call: the caller, never the PIN; the supervisor
    locks the line again with the journal's PIN."""
    import trio

    from voiceactors.call.call_context import CallContext, LinkedContext, PhoneCall, carried_view, taken_over_context
    from voiceactors.call.supervisor import CallSupervisor

    journal = tmp_path / "journal"
    (journal / "config").mkdir(parents=True)
    linked = LinkedContext("instruction", phone=PhoneCall("+1••••••••67", "from", pin="2468", transfer_to=None))
    view = carried_view(linked)
    assert "2468" not in json.dumps(view) and view["phone"]["pin_required"] is True
    carried = taken_over_context(view)
    assert carried is not None and carried.phone is not None and carried.phone.pin is None
    assert not CallContext(carried).phone.open                  # locked, and no entry opens it yet
    supervisor = CallSupervisor(Settings(journal=journal, state_dir=tmp_path / "state"),
                                trio.open_memory_channel(1)[0])
    for pin, opens in (("1357", "1357#"), (None, None)):
        block = {"phone": {"allowed_callers": [OWNER], **({"pin": pin} if pin else {})}}
        (journal / "config" / "journal.json").write_text(json.dumps({"voice": block}))
        again = supervisor._pin_again(carried)
        line = CallContext(again).phone
        if pin is None:                                           # the owner removed the PIN: open
            assert line.open
        else:
            assert not line.open and [line.key(k) for k in opens][-1] == "accepted"


def test_a_webhook_secret_is_never_logged():
    from voiceactors import logs

    unseen = "whsec_" + "c2VjcmV0LW5vdC15ZXQtcmVnaXN0ZXJlZA=="     # a secret's shape is enough
    assert unseen not in json.dumps(logs.scrub({"detail": f"verifying with {unseen}"}))
    assert logs.is_secret_field("openai_webhook_secret_env") and logs.is_secret_field("webhook_secret")
