"""What a person should hear at start, before they find out the hard way.

A server with no OpenAI key would otherwise say so only when the person
presses Start; a journal folder with no days would answer every question
with nothing. ``serve`` logs each notice once at start (a warning with what
to do), and the console's first screen shows the same words
(``GET /api/voice/console-config``'s ``notices``).
"""

from __future__ import annotations

import enum

from voiceactors import voice_config
from voiceactors.journal.days import list_days
from voiceactors.settings import Settings


class Notice(str, enum.Enum):
    NO_OPENAI_KEY = "no_openai_key"
    JOURNAL_EMPTY = "journal_empty"


#: What to do, in the server's log (the console says it in its own words).
WHAT_TO_DO: dict[Notice, str] = {
    # the journal's key is read again on each call (voice_config.py); the environment only at start
    Notice.NO_OPENAI_KEY: ("no OpenAI key is configured: calls will be refused. Put voice.openai_api_key in the "
                           "journal's config/journal.json (read again at the next call, no restart), or restart "
                           "with OPENAI_API_KEY set. `voiceactors demo` needs no key."),
    Notice.JOURNAL_EMPTY: ("the journal folder has no days (no chronicle/YYYYMMDD folders): the assistant will "
                           "find nothing in it. Check --journal, or try `voiceactors demo` (a sample journal)."),
}


def startup_notices(settings: Settings) -> list[Notice]:
    """The notices that hold for ``settings`` now (reads the journal's
    config and lists its day folders: call off the event loop, or at start)."""
    notices = []
    try:
        if not voice_config.openai_api_key(settings):
            notices.append(Notice.NO_OPENAI_KEY)
    except voice_config.ConfigUnreadable:
        pass          # not "no key": an unreadable config is reported where a call needs it
    if not list_days(settings.journal):
        notices.append(Notice.JOURNAL_EMPTY)
    return notices
